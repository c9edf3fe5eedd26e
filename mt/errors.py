class MTError(Exception):
    """A problem the user can fix (bad config, corpus, flag or checkpoint).

    The CLI prints it as one line and exits with status 2; it never shows a traceback.
    """
