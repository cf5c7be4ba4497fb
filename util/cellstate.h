/*
 * util/cellstate.h - the states of a cell, as an enum with one string table.
 *
 * A cell is one (model, width, pass) of a job's matrix. It waits, one of
 * capd's children runs it, and the attempt ends in an outcome; a cell that
 * an attempt never ran (a width its host lacks, no GPU, a set-up that
 * failed) still ends in one. docs/protocol.md ("Outcome") says which rule
 * decides; daemon/attempt/outcome.h applies them.
 *
 *   queued          waiting for a child (again, after an interrupted attempt
 *                   that had attempts left)
 *   running         a child is running its attempt
 *   ok              the runner's end frame said ok, then it exited 0
 *   failed          a non-zero exit, an end frame that said failed, exit 0
 *                   without an end frame, or capd failed it (the reason says
 *                   why: an exec that failed, records lost to a write)
 *   crashed         killed by a signal (the cell's signal names it)
 *   timeout         ran past its timeout_s: SIGTERM to its group, SIGKILL
 *                   after the grace period
 *   cancelled       its job was cancelled
 *   unsupported     the runner's end frame said so (the width asked for is
 *                   not the effective one), or capd's host cannot run the
 *                   width (host_missing says what it lacks)
 *   protocol_error  the runner broke the frame protocol (docs/protocol.md)
 *   interrupted     capd stopped while the cell ran, and it had no attempt
 *                   left to be queued again
 *   oom             killed for memory past its limit (its cgroup or capd's
 *                   watchdog), or the framework could not allocate
 *
 * The enum's order is the schema's (schema/001_init.sql, then 006's oom),
 * and the order in which capd lists states (GET /metrics, capctl's
 * progress line); CELL_STATE_N counts them, so a loop over
 * 0..CELL_STATE_N-1 visits every state once. The names are the wire and
 * storage format: the JSON strings of the API (schema/openapi.yaml's
 * CellState) and the SQL text of cells.state. tests/test_util.c checks the
 * table against openapi.yaml, so a state cannot be added in one place only.
 *
 * Usage:
 *
 *     enum cell_state st;
 *     if (cell_state_parse(json_string_value(v), &st) == 0 && cell_state_final(st))
 *         ...
 *     if (cell_state_is(text, CELL_OK))
 *         ...
 */
#ifndef CAPD_UTIL_CELLSTATE_H
#define CAPD_UTIL_CELLSTATE_H

#include <stdbool.h>

enum cell_state {
    CELL_QUEUED,
    CELL_RUNNING,
    CELL_OK,
    CELL_FAILED,
    CELL_CRASHED,
    CELL_TIMEOUT,
    CELL_CANCELLED,
    CELL_UNSUPPORTED,
    CELL_PROTOCOL_ERROR,
    CELL_INTERRUPTED,
    CELL_OOM,
    CELL_STATE_N
};

/* The state's name ("protocol_error"); NULL for a value outside the enum. */
const char *cell_state_name(enum cell_state st);

/* 0 and *OUT set when S names a state exactly; -EINVAL (OUT untouched) for
 * NULL or any other word. */
int cell_state_parse(const char *s, enum cell_state *out);

/* Whether S names ST: false for NULL and for any other word. */
bool cell_state_is(const char *s, enum cell_state st);

/* Final: an outcome, every state but queued and running. A cell in one
 * stays there (only an interrupted attempt with attempts left is queued
 * again, and that never shows as interrupted). */
bool cell_state_final(enum cell_state st);

/* A failure of the build under test: failed, crashed, timeout,
 * protocol_error or oom. Not ok, cancelled (a person's choice),
 * unsupported (the width cannot run there) or interrupted (capd stopped):
 * a comparison counts ok -> a failure as an outcome regression. */
bool cell_state_failure(enum cell_state st);

#endif
