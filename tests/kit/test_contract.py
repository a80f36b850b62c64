"""docs/contract.md and the kit agree: every case cites existing rules, every rule has a case."""

from __future__ import annotations

import re
from pathlib import Path

from rheo_flow.testing import CASES

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
RULE = re.compile(r"^- \*\*`([a-z_]+\.[a-z_]+)`\*\*", re.MULTILINE)


def contract_rules() -> list[str]:
    """The rule names that docs/contract.md defines, in order."""
    return RULE.findall(CONTRACT.read_text(encoding="utf-8"))


def test_the_contract_defines_each_rule_once() -> None:
    rules = contract_rules()
    assert len(rules) >= 40
    assert len(rules) == len(set(rules)), sorted(r for r in rules if rules.count(r) > 1)


def test_every_case_cites_rules_of_the_contract() -> None:
    defined = set(contract_rules())
    uncited = [c.name for c in CASES if not c.rules]
    assert uncited == [], f"cases citing no rule: {uncited}"
    unknown = {c.name: sorted(set(c.rules) - defined) for c in CASES if set(c.rules) - defined}
    assert unknown == {}, f"cases citing rules docs/contract.md does not define: {unknown}"


def test_every_rule_has_a_case() -> None:
    cited = {rule for c in CASES for rule in c.rules}
    assert [rule for rule in contract_rules() if rule not in cited] == []
