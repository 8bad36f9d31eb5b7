"""Checks every new page's browser test makes at both sizes: nothing wider than the screen, and every control
(button, field, menu, folding summary, button-styled link) at least 24 x 24 px (WCAG 2.2's target size)."""

from __future__ import annotations

from typing import Any

SIZES = {"laptop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}

LAYOUT_PROBLEMS = """() => {
  const out = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) out.push(`the page is ${root.scrollWidth} px wide on a ${root.clientWidth} px screen`);
  for (const el of document.querySelectorAll('main button, main input:not([type=hidden]), main select, main textarea, main summary, main a.btn')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;  // hidden (a closed details' content)
    if (r.width < 23.5 || r.height < 23.5) out.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} "${(el.textContent || el.name || '').trim().slice(0, 30)}" is ${Math.round(r.width)} x ${Math.round(r.height)} px`);
  }
  return out;
}"""


def layout_problems(page: Any) -> list[str]:
    """What is wrong with the page's layout at its current size (empty when nothing)."""
    return list(page.evaluate(LAYOUT_PROBLEMS))
