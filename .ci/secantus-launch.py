"""Start SecantusDB (``secantusd-py``'s own ``main``) with one repair: an O(1) prune.

SecantusDB 0.7.0b3 prunes its retryable-write records on every retryable write by
scanning all of them, and once it holds its cap of 10,000 by sorting all of them:
past the first 10,000 writes each write costs milliseconds of the server's one
Python core, which made the emulator the slowest part of the test run. Records
are inserted in time order, so the same rule (drop those past their lifetime,
then the oldest beyond the cap) only ever needs to look at the oldest ones.
"""

import sys

from secantus import transactions
from secantus.cli import main


def _prune_oldest(self: transactions.TransactionRegistry) -> None:
    # A record written again keeps its place: at worst it leaves a little early.
    records = self._retryable
    cutoff = self._time() - transactions._RETRYABLE_RECORD_LIFETIME_SECONDS
    while records:
        oldest = next(iter(records))
        if records[oldest][1] >= cutoff and len(records) <= transactions._RETRYABLE_RECORD_MAX:
            return
        del records[oldest]


transactions.TransactionRegistry._prune_retryable_locked = _prune_oldest  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "secantusd-py"
    sys.exit(main())
