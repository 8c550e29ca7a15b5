"""The leaderboard: built from recorded runs' cards (plus the shipped ones), ranked, filterable, opens offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attune.cards.build import make_card
from attune.cli import _mount_optional, app
from attune.errors import AttuneError
from attune.leaderboard.site import build_site
from tests.report.runs import REPO, scripted_run, sim_run

_mount_optional()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("board")
    cards = root / "cards"
    shipped = REPO / "openrecipes" / "cards"
    if shipped.is_dir():
        shutil.copytree(shipped, cards)
    # two recorded runs of our own: a simulated one and a "measured" CPU one (the fake, named local)
    make_card(sim_run(root / "sim", recipe="14-deepseek-v2-lite-h200x16.yaml", budget="11.4"), cards / "new",
              cid="recorded-deepseek--sim")
    cpu = root / "cpu"
    scripted_run(cpu, backend_name="local")
    make_card(cpu, cards / "new", cid="recorded-tiny--real")
    return build_site(cards, root / "site")


def test_index_json_ranks_every_card(site):
    index = json.loads((site.out / "index.json").read_text())
    assert index["schema"] == "attune.dev/leaderboard-index/v1" and index["count"] == len(site.entries)
    by_group: dict[str, list[dict]] = {}
    for e in index["cards"]:
        by_group.setdefault(e["group"], []).append(e)
        for key in ("page", "card", "result"):
            assert (site.out / e[key]).is_file(), e[key]
    for entries in by_group.values():
        assert [e["rank"] for e in entries] == list(range(1, len(entries) + 1))
        tps = [e["tokens_per_s_per_device"] for e in entries]
        assert tps == sorted(tps, reverse=True)
    kinds = {e["kind"] for e in index["cards"]}
    assert kinds == {"measured", "simulated"}


def _visible(browser) -> list[str]:
    return browser.evaluate("[...document.querySelectorAll('tr.entry')].filter(r => !r.hidden)"
                            ".map(r => r.dataset.kind + ':' + r.dataset.hardware + ':' + r.dataset.id)")


def _set(browser, el_id: str, value) -> None:
    prop = "checked" if isinstance(value, bool) else "value"
    browser.evaluate(f"(() => {{ const e = document.getElementById('{el_id}'); e.{prop} = {json.dumps(value)};"
                     " e.dispatchEvent(new Event('change')); })()")


def test_index_in_chromium_with_filters(browser, site, shots: Path):
    page = browser.open(site.index.as_uri())
    assert page.errors() == [] and page.external_requests() == []
    assert any(u.endswith("assets/site.js") for u in page.requests)  # its assets are local files
    assert browser.evaluate("document.documentElement.getAttribute('data-ready')") == "1"
    browser.screenshot(shots / "leaderboard-index.png")
    rows = _visible(browser)
    assert len(rows) == len(site.entries)
    _set(browser, "f-simulated", False)
    only_real = _visible(browser)
    assert only_real and all(r.startswith("measured:") for r in only_real)
    _set(browser, "f-simulated", True)
    _set(browser, "f-measured", False)
    assert all(r.startswith("simulated:") for r in _visible(browser))
    _set(browser, "f-measured", True)
    _set(browser, "f-hardware", "h200")
    h200 = _visible(browser)
    assert h200 and all(":h200:" in r for r in h200)
    hidden_groups = browser.evaluate("[...document.querySelectorAll('tbody.group')].filter(g => g.hidden).length")
    with_h200 = sum(any(i["entry"].card.hardware.accelerator == "h200" for i in g["entries"]) for g in site.groups)
    assert hidden_groups == len(site.groups) - with_h200
    assert browser.evaluate("document.getElementById('count').textContent").startswith(f"{len(h200)} of ")
    _set(browser, "f-hardware", "")
    _set(browser, "f-framework", "torch")
    torch_ids = sorted(e.card.id for e in site.entries if e.card.framework.name == "torch")
    assert torch_ids and sorted(r.split(":", 2)[2] for r in _visible(browser)) == torch_ids
    assert all(r.startswith("measured:") for r in _visible(browser))  # every torch card is a real CPU run
    _set(browser, "f-framework", "")
    _set(browser, "f-size", "<100M")
    assert all(":cpu:" in r for r in _visible(browser))
    _set(browser, "f-size", "")
    _set(browser, "f-search", "deepseek")
    assert _visible(browser) and all("deepseek" in r for r in _visible(browser))


def test_every_card_page_renders(browser, site, shots: Path):
    for i, e in enumerate(site.entries):
        page = browser.open((site.out / "cards" / f"{e.card.id}.html").as_uri(), settle=0.05)
        assert page.errors() == [], (e.card.id, page.errors())
        assert page.external_requests() == []
        found = browser.evaluate("""({search: !!document.querySelector('svg.search-chart'),
            loss: !!document.querySelector('svg.loss-chart') || !!document.querySelector('#loss p'),
            gate: document.querySelectorAll('table.gate tbody tr').length,
            reproduce: document.querySelector('pre.reproduce').textContent})""")
        assert found["search"] and found["loss"] and found["gate"] == len(e.card.evidence.gate)
        assert found["reproduce"] == e.card.reproduce.command
        if i == 0 or e.card.measurement.kind == "measured" or e.card.id.startswith("recorded-"):
            browser.screenshot(shots / f"leaderboard-card-{e.card.id}.png")


def test_leaderboard_opens_with_networking_disabled(offline_browser, site, shots: Path):
    page = offline_browser.open(site.index.as_uri())
    assert page.errors() == [] and page.external_requests() == []
    assert offline_browser.evaluate("document.querySelectorAll('tr.entry').length") == len(site.entries)
    first = site.entries[0].card.id
    page = offline_browser.open((site.out / "cards" / f"{first}.html").as_uri())
    assert page.errors() == [] and page.external_requests() == []
    offline_browser.screenshot(shots / "leaderboard-card-offline.png")


def test_a_card_that_disagrees_with_its_run_is_not_published(tmp_path: Path, recorded_run: Path):
    files = make_card(recorded_run, tmp_path / "cards")
    text = files.card_path.read_text()
    files.card_path.write_text(text.replace("speedup: ", "speedup: 9", 1))
    with pytest.raises(AttuneError, match="disagree"):
        build_site(tmp_path / "cards", tmp_path / "site")
    res = CliRunner().invoke(app, ["leaderboard", "build", str(tmp_path / "cards"), "--out", str(tmp_path / "s")])
    assert res.exit_code == 1


def test_leaderboard_command(tmp_path: Path, recorded_run: Path):
    make_card(recorded_run, tmp_path / "cards")
    res = CliRunner().invoke(app, ["leaderboard", "build", str(tmp_path / "cards"), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "index.html").exists() and (tmp_path / "s" / "assets" / "site.css").exists()
