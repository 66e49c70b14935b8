"""The supported-ops, model-families and model-zoo tables (docs/models.md; the README links to them) are
generated from the op table (scripts/gen_ops_table.py); regenerating them must give the committed text."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_ops_table", os.path.join(ROOT, "scripts", "gen_ops_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_tables_are_up_to_date():
    gen = load_generator()
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        current = f.read()
    assert gen.render(current) == current, (
        "docs/models.md's generated tables are stale: run `python scripts/gen_ops_table.py`")


def test_every_op_in_the_table_is_listed_once_under_its_family():
    gen = load_generator()
    from ortmod import _C
    ops = list(_C.op_table())
    grouped = gen.ops_by_family(ops)
    assert "?" not in grouped, f"ops whose family file was not found: {grouped.get('?')}"
    assert sum(len(v) for v in grouped.values()) == len(ops)
    text = gen.render_ops(ops)
    for name, domain, _ in ops:
        assert name in text
