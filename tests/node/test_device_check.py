"""`join --device` is judged before the node joins (node/supervisor.py: check_device_here)."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.node.supervisor import check_device_here


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_device_this_machine_lacks_is_refused_in_one_line() -> None:
    with pytest.raises(UserError) as refused:
        check_device_here("cuda:1")
    assert str(refused.value) == "--device cuda:1: this machine has no CUDA GPU torch can use"


def test_the_cpu_is_always_here() -> None:
    check_device_here("cpu")
    check_device_here("auto")
