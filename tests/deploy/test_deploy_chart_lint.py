"""`helm lint --strict` passes for every value set the project ships."""

import pytest
from chart_render import CHART, KUBE_VERSION, PROFILES, helm, profile_values

WARNING = 2  # lint severities: 1 info, 2 warning, 3 error; strict turns warnings into failures


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_chart_lints_strictly_for_each_profile(profile):
    report = helm.lint(CHART, profile_values(profile), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["total_charts_linted"] == 1
    assert (problems, report["errors"]) == ([], [])


def test_lint_reports_values_the_schema_rejects():
    report = helm.lint(CHART, {"tensorParallel": 3}, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert any("tensorParallel" in error for error in report["errors"])

