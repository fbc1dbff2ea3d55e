"""Without --address, `scaledl plan` uses the Ray already running for this machine (RAY_ADDRESS, or the cluster
`ray start` recorded), and starts its own only when there is none."""

from __future__ import annotations


def test_a_plan_uses_the_ray_running_for_this_machine(monkeypatch, tmp_path) -> None:
    from orchestrator.planning import running_ray

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no `ray start` cluster recorded there
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert running_ray() is None  # scaledl plan starts its own
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    assert running_ray() == "10.0.0.7:6379"


def test_a_stale_record_of_a_stopped_ray_start_is_not_used(monkeypatch, tmp_path) -> None:
    from orchestrator.planning import running_ray

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # no GCS runs there
    assert running_ray() is None
