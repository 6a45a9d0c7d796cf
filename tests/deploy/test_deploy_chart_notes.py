"""NOTES.txt prints the next commands for the release that was just installed."""

from chart_render import profile_values, render_files


def _notes(profile="default", **extra):
    return render_files(profile_values(profile, extra))["dflash-triton/templates/NOTES.txt"]


def test_notes_give_rollout_port_forward_request_metrics_and_helm_test():
    notes = _notes()
    assert "rollout status deployment/dflash-dflash-triton" in notes
    assert "port-forward service/dflash-dflash-triton 8000 8001 8002" in notes
    assert "/v2/models/ensemble/generate" in notes and "/metrics" in notes
    assert "helm test dflash -n serving" in notes


def test_notes_state_the_startup_budget_and_the_build_step():
    notes = _notes("gpt-oss-120b-tp8")
    assert "the startup probe allows 1800 s" in notes
    assert "-c prepare" in notes and "TP=8, 8 x nvidia.com/gpu" in notes


def test_notes_for_the_cpu_profile_say_cpu_only():
    assert "TP=1, CPU only" in _notes("cpu")


def test_notes_explain_the_custom_metric_only_when_autoscaling():
    assert "custom.metrics.k8s.io" not in _notes()
    assert "pods/*/dflash_requests_in_flight" in _notes(autoscaling={"enabled": True})


def test_notes_for_pvc_mode_name_the_claim_and_paths():
    notes = _notes(storage={"mode": "pvc", "existingClaim": "engines"})
    assert "from the claim engines: /data/engines/gpt-oss-120b-tp8" in notes and "-c prepare" not in notes
