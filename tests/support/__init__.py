"""Test scaffolding that tests and scripts share and the wheel does not ship: the checkpoint factory
(`support.factory`) and the scripted fake engine (`support.fake_engine`). Importable as `support.*` with
tests/ on sys.path (pytest's rootdir conftest puts it there; scripts add it themselves)."""
