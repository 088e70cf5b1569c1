"""A user's own translation pairs as tests write them: real-looking text, so that SentencePiece has
something to learn."""

from __future__ import annotations

WORDS = "the a file menu click open save print view insert format table tools window help".split()
CHARACTERS = "文件菜单点击打开保存打印视图插入格式表格工具窗口帮助"


def translator_rows(n: int = 600) -> list[str]:
    """`n` zh <TAB> en lines, each source and target distinct (they end in their number)."""
    rows = []
    for i in range(n):
        en = " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(2 + i % 6))
        zh = "".join(CHARACTERS[(i + k * 5) % len(CHARACTERS)] for k in range(2 + i % 9))
        rows.append(f"{zh}{i}\t{en} {i}")
    return rows
