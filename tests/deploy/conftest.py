"""Fixtures of the deployment tests; the rendering helpers live in chart_render.py."""

import pytest
from chart_render import chart as _loaded_chart


@pytest.fixture(scope="session")
def chart():
    return _loaded_chart()
