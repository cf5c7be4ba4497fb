/*
 * daemon/log.h - the log module lives in util/log.h. This file only lets
 * daemon/sup.c and daemon/zygote.c, which are being reworked on another
 * branch, keep their include line; it goes once they include util/log.h.
 */
#include "util/log.h"
