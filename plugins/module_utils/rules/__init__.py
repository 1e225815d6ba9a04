"""One module per role: the rules of its settings (plugins/module_utils/settings.py says how one is written)."""
