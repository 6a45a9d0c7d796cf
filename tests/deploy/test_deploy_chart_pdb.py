"""The PodDisruptionBudget protects the server pods from voluntary disruptions."""

from chart_render import kinds, only, profile_values, render


def test_pdb_allows_one_pod_down_by_default():
    objects = render(profile_values("default"))
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == only(objects, "Service")["spec"]["selector"]


def test_pdb_can_keep_a_minimum_available_instead():
    values = {"podDisruptionBudget": {"maxUnavailable": None, "minAvailable": "50%"}}
    pdb = only(render(profile_values("default", values)), "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": "50%", "selector": pdb["spec"]["selector"]}


def test_pdb_can_be_turned_off():
    objects = render(profile_values("default", {"podDisruptionBudget": {"enabled": False}}))
    assert "PodDisruptionBudget" not in kinds(objects)
