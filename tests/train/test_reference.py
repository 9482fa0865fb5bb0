import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.model import build_model, loss_fn
from p2ptrain.train.reference import forward_backward, micro_batch_rows, train_reference


def test_micro_batches_split_rows_evenly() -> None:
    assert micro_batch_rows(5, 2) == [range(0, 3), range(3, 5)]
    assert micro_batch_rows(2, 4) == [range(0, 1), range(1, 2)]


def test_micro_batched_gradient_equals_full_batch_gradient() -> None:
    spec = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, stages=1)
    x = torch.randint(0, 256, (6, 8))
    y = torch.randint(0, 256, (6, 8))
    a, b = build_model(spec), build_model(spec)
    loss_a = forward_backward(a, x, y, micro_batches=3)
    loss_b = loss_fn(b(x), y)
    loss_b.backward()
    assert abs(loss_a - loss_b.item()) < 1e-5
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad is not None and pb.grad is not None
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)


def test_default_run_learns_visibly() -> None:
    torch.set_num_threads(1)
    losses = train_reference(RunSpec(), steps=40)
    assert len(losses) == 40
    assert losses[-1] < 0.7 * losses[0], losses  # >= 30% lower after 40 steps
