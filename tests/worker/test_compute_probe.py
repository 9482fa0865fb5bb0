import json

from p2ptrain.records import ComputeReport, RunSpec, message_from_dict
from p2ptrain.worker.compute_probe import MAX_ROWS, measure_stage_compute, probe_rows


def test_probe_times_the_default_model_per_row() -> None:
    spec = RunSpec()
    compute = measure_stage_compute(spec)
    assert (
        compute.rows
        == probe_rows(spec)
        == min(MAX_ROWS, spec.optim.batch_size // spec.optim.micro_batches)
    )
    assert compute.block_row_s > 0 and compute.embed_row_s > 0 and compute.head_row_s > 0
    assert compute.device == "cpu" and compute.run_id == spec.run_id
    # what the planner checks stages against: this machine's memory, and the passes' precision
    assert compute.memory_bytes > 2**28 and compute.precision == "fp32"
    # what the worker sends decodes back to the same record on the control side
    line = json.dumps(ComputeReport(compute).to_dict())
    assert message_from_dict(json.loads(line)) == ComputeReport(compute)


def test_probe_follows_the_run_shape() -> None:
    spec = RunSpec().replace(
        batch_size=6, micro_batches=3, n_layer=2, n_embd=64, n_head=2, block_size=32
    )
    compute = measure_stage_compute(spec)
    assert compute.rows == 2 and compute.block_row_s > 0
