/*
 * daemon/metrics.h - the metrics module lives in util/metrics.h. This file
 * only lets daemon/sup.c, which is being reworked on another branch, keep
 * its include line; it goes once sup.c includes util/metrics.h.
 */
#include "util/metrics.h"
