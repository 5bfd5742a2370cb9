"""The second stage: what upstream ships and how a series lands on it.

The pinned artifacts (wheels, sdists) are downloaded and verified against the
pins (`fetch`), a wheel's RECORD is read and written (`record`), and a series
is applied to upstream's files with zero fuzz (`applier`). The wheel builder,
the runtime overlay, the tracking commands and the test harness all start
from here.
"""
