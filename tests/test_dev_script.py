"""The test set-up installs what the browser tests need: Debian's Chromium and a CJK font."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dev_script_installs_chromium_and_a_cjk_font() -> None:
    script = (ROOT / "scripts" / "dev.sh").read_text()
    install = next(line for line in script.splitlines() if "apt-get install" in line)
    assert "chromium" in install and ("fonts-wqy-zenhei" in install or "fonts-noto-cjk" in install)
    assert "fc-list :lang=zh" in script  # a machine with Chromium but no CJK font still gets one


def test_css_font_stacks_name_cjk_fonts() -> None:
    css = (ROOT / "static" / "css" / "app.css").read_text()
    for font in ("Noto Sans CJK SC", "PingFang SC", "Microsoft YaHei", "WenQuanYi Zen Hei"):
        assert font in css
