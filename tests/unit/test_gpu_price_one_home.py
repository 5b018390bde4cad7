"""One GPU price catalogue (issue 35, item 4): notebook 14's price defaults come from
workshop/data/gpus.json, the catalogue notebook 2 prices with, not from numbers of its own."""

import ast
import pathlib

from workshop.sizing import capacity

NB14 = pathlib.Path(__file__).resolve().parents[2] / "notebooks/src/14_production_gateway.py"


def test_h100_has_both_prices_with_sources():
    h100 = capacity.load_gpus()["H100-SXM"]
    assert h100.price_usd_hour and h100.price_source
    assert h100.reserved_price_usd_hour and h100.reserved_price_source
    assert h100.reserved_price_usd_hour < h100.price_usd_hour


def test_notebook_14_price_defaults_are_read_from_the_catalogue():
    tree = ast.parse(NB14.read_text())
    defaults = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("price_on_demand", "price_reserved")):
            defaults[node.targets[0].id] = node.value.args[2]
    assert set(defaults) == {"price_on_demand", "price_reserved"}
    for name, default in defaults.items():
        assert not isinstance(default, ast.Constant), f"{name} has a price of its own"
    assert ast.unparse(defaults["price_on_demand"]) == "price_gpu.price_usd_hour"
    assert ast.unparse(defaults["price_reserved"]) == "price_gpu.reserved_price_usd_hour"
