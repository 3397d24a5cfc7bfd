"""Every YAML file a user hands tailgate goes through one reader (userfiles.compose_yaml): the
baseline, a bench scenario, a campaign and serve's web config refuse the same hostile documents
with the same one-line errors naming the file and line (exit 2 from their commands)."""

from __future__ import annotations

import pytest

from tailgate.baseline import BaselineError, load_baseline
from tailgate.bench.scenario import ScenarioError, parse_scenario
from tailgate.campaign.spec import CampaignError, parse_campaign
from tailgate.fleet.web import WebConfigError, load_web_config

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, n in zip("abcde", "bcdef", strict=True))
DEEP = "k: " + "[" * 17 + "]" * 17 + "\n"
CASES = [
    (BOMB, r"more than 10000 values once its aliases are expanded \(an alias bomb\?\)"),
    (DEEP, r":1: nested deeper than 16 levels"),
    ("k: [unclosed\n", r":2: malformed YAML"),
]


def loaders(tmp_path):
    def via_file(load):
        def run(text: str) -> None:
            path = tmp_path / "user.yaml"
            path.write_text(text)
            load(str(path))
        return run

    return [(via_file(load_baseline), BaselineError),
            (lambda t: parse_scenario(t, str(tmp_path / "user.yaml")), ScenarioError),
            (lambda t: parse_campaign(t, str(tmp_path / "user.yaml")), CampaignError),
            (via_file(load_web_config), WebConfigError)]


@pytest.mark.parametrize("text,message", CASES, ids=["alias-bomb", "deep", "malformed"])
def test_every_user_yaml_refuses_the_same_hostile_documents(tmp_path, text, message):
    for load, error in loaders(tmp_path):
        with pytest.raises(error, match=message) as exc:
            load(text)
        msg = str(exc.value)
        assert msg.startswith(str(tmp_path / "user.yaml")) and "\n" not in msg, msg
