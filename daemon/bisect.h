/*
 * daemon/bisect.h - bisection over per-commit builds, advanced by the
 * daemon loop (docs/history.md, "Bisection").
 *
 * A bisection (storage/store.h, "bisection") lives in the database: its
 * commits, its job template, its probes. bisect_step reads every running
 * one and moves it on as far as the finished jobs allow: it captures the
 * two ends (reusing a finished job of the commit when there is one),
 * judges each finished probe against the good end by the predicate
 * (numerics: a cell diverged; outcome: a cell's outcome regressed or
 * changed; perf: a paired perf regression past the threshold), skips a
 * commit whose build did not start (like git bisect's exit 125) or whose
 * perf verdict could not be decided, and submits the next round: the two
 * quartile points of the commits still in question (Pinpoint's
 * speculation: whichever way the midpoint would go, one of them is the
 * next midpoint). A round halves the range at worst, so N commits take at
 * most ceil(log2(N)) rounds with nothing skipped. It ends with the first
 * bad commit and the comparison of it against its parent.
 *
 * Everything it decides is written before it acts on it, so the loop may
 * call it at any time, as often as it likes, and a restarted capd carries
 * on where the last one stopped. Comparisons run on the loop thread: a
 * probe job's cells are what one bisection compares, not a whole history.
 */
#ifndef CAPD_BISECT_H
#define CAPD_BISECT_H

#include <stdbool.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* Advances every running bisection; true when it created jobs (the caller
 * then runs the scheduler). Commits an open ingest batch first. */
bool bisect_step(struct store *st, const struct capd_config *cfg);

#endif
