#!/bin/sh
# test_shoald_minute.sh with the ledger in a PostgreSQL server the test starts (and stops at
# the end, also on failure); skipped where the server binaries are missing.
LEDGER_MODE=pg exec sh "$(dirname "$0")/test_shoald_minute.sh"
