class MTError(Exception):
    """A problem the user can fix (bad config, corpus, flag or checkpoint).

    The CLI prints it as one line and exits with status 2; it never shows a traceback.
    """


def shorten(text: str, limit: int = 40) -> str:
    """`text` cut to `limit` characters, "..." marking the cut: a value a user gave, shown in
    a one-line message (a 400-digit number must not make it 400 characters longer)."""
    return text if len(text) <= limit else text[:limit] + "..."


def first_line(e: BaseException, limit: int = 200) -> str:
    """What a one-line message quotes of an exception: its first non-empty line, cut to `limit`
    characters, or its type's name where it says nothing."""
    text = str(e).strip()
    return shorten(text.splitlines()[0], limit) if text else type(e).__name__


class Interrupted(KeyboardInterrupt):
    """The user stopped the program without waiting for a clean stop (a second Ctrl-C).
    The CLI prints the message (what was lost, how to go on) and exits with status 130.
    A KeyboardInterrupt, so that no `except Exception` on the way swallows it."""
