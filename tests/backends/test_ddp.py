"""The training loop on 2 real processes (gloo), launched through `hasten launch`."""

from launching import launch


def test_ddp_training_matches_one_process_and_accumulates():
    result = launch("train_ddp_checks.py")
    for check in ("equivalence no", "equivalence bf16", "no_sync accumulation scheduler", "sync_each_batch",
                  "facade collectives", "comm hook tied weights"):
        assert result.stdout.count(f"OK {check}") == 2, result.stdout
    assert result.stdout.count("ALL DONE") == 2


def test_demo_trains_on_two_processes():
    result = launch("../../examples/demo.py")
    lines = [line for line in result.stdout.splitlines() if line.startswith("epoch")]
    assert len(lines) == 6, result.stdout  # printed once (main process), one line per epoch
    losses = [float(line.split("loss ")[1].split()[0]) for line in lines]
    assert losses[-1] < losses[0] * 0.3, losses
    assert "2 processes, DistributedType.MULTI_CPU" in result.stdout


def test_prepared_loaders_split_flush_and_metrics():
    result = launch("train_loader_checks.py")
    for check in ("split_batches equivalence", "accumulation flush", "gather_for_metrics skip_first_batches",
                  "even_batches"):
        assert result.stdout.count(f"OK {check}") == 2, result.stdout
