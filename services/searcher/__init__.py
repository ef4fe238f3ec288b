"""The searcher service: a frozen search agent the Thinker delegates to (``POST /search``)."""
