"""``--report-to tensorboard`` seen as a person sees it: TensorBoard served on loopback over a
folder of runs, its time-series page opened in a real headless Chromium (Debian's, driven by
Playwright). The screenshot is kept in build/test-artifacts/.

Run as a script, it takes the screenshot of the docs (docs/tracking.md):
``python tests/services/test_tensorboard_web.py runs docs/assets/tensorboard.png``."""

import shutil
import sys
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync"]
FLAGS += ["--disable-background-networking", "--disable-component-update"]
TAGS = "^(reward|success|entropy|response_tokens)$"  # the curves the page shows


def screenshot(logdir: Path, path: Path) -> str:
    """Serve TensorBoard over ``logdir`` on loopback, open its time series of ``TAGS`` in
    Chromium, wait for their charts, save the page to ``path``; the page's text."""
    from playwright.sync_api import sync_playwright
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0"])
    url = board.launch()  # served from a thread of this process until it exits
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{url}#timeseries", timeout=60_000)
        page.get_by_text("response_tokens", exact=True).first.wait_for(timeout=60_000)
        page.get_by_role("combobox", name="Filter tags (regex)").fill(TAGS)
        page.get_by_role("button", name="Settings").click()  # the curves, not the knobs
        page.get_by_text("loss", exact=True).first.wait_for(state="hidden", timeout=30_000)
        page.wait_for_timeout(2_000)  # the charts' lines drawn
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=path)
        body = page.inner_text("body")
        browser.close()
    return body


@pytest.mark.browser
def test_tensorboard_shows_a_runs_curves_in_a_browser(tiny_dir, tmp_path):
    from llm_gym.train import GRPOConfig, GRPOTrainer

    assert Path(CHROMIUM).exists(), "chromium is missing: run scripts/setup.sh (it installs it)"
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / "tiny-run"), env_args={"task": "chain_sum"},
        iterations=3, groups=1, group_size=2, max_new_tokens=4, eval_episodes=0,
        progress=False, report_to="tensorboard",
    )  # fmt: skip
    GRPOTrainer(config).train()
    body = screenshot(tmp_path, ARTIFACTS / "tensorboard.png")
    assert "tiny-run" in body  # the run, by its folder's name
    for tag in ("reward", "success", "entropy", "response_tokens"):
        assert tag in body.split()
    assert "loss" not in body.split()  # filtered to TAGS
    assert (ARTIFACTS / "tensorboard.png").stat().st_size > 10_000


if __name__ == "__main__":
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2])))
