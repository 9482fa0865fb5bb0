"""A session's setup is frozen out of Python's cyclic collector, and given back when it closes."""

import gc
import weakref

from p2ptrain.worker import collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_setup_is_frozen_out_of_collections_and_collected_after_the_session() -> None:
    cycle = _Node()
    alive = weakref.ref(cycle)
    collector.freeze_setup()
    try:
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()  # a full collection mid-session: frozen objects are not its work
        assert alive() is not None
    finally:
        collector.thaw()
    assert gc.get_freeze_count() == 0
    assert alive() is None  # the closed session's garbage went with the thaw
