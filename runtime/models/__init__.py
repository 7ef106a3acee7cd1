"""Models the runtime builds itself: the tiny test language model."""
