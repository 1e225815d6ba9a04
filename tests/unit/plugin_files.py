"""The plugins under plugins/ (gpufleet.fleet.*) imported from their files, for the tests that call them directly
(tests/unit/test_plugins_*.py): the shared rules of the roles."""

from __future__ import annotations

from conftest import REPO_ROOT, load_script

REPO = REPO_ROOT

tests_plugin = load_script(REPO / "plugins/test/gpufleet_tests.py")
filters = load_script(REPO / "plugins/filter/gpufleet_filters.py")
stack = load_script(REPO / "plugins/lookup/stack.py")
settings = load_script(REPO / "plugins/lookup/role_settings.py")
MATRIX = stack.load_matrix()
