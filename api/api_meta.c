/* api/api_meta.c - GET /healthz, /v1/models, /v1/widths, /v1/host. */
#include <unistd.h>

#include "api/api_int.h"
#include "daemon/cpu/hostcpu.h"
#include "daemon/host/memlimit.h"
#include "daemon/cpu/widths.h"

/* The health document also says how trusting this capd is configured to
 * be: whether tokens are needed and whether cells run as root
 * (allow_root_cells), so a monitor can alert on either. */
enum MHD_Result api_healthz(struct api_req *r)
{
    const struct capd_config *cfg = api_cfg(r);
    bool root_cells = geteuid() == 0 && cfg->run_uid < 0;
    return api_json(r, 200,
                    json_pack("{s:s,s:s,s:i,s:b,s:b}", "status", "ok", "version", CAPD_VERSION,
                              "running_cells", (int)capd_running_cells(api_daemon(r)),
                              "auth_required", cfg->auth_required, "cells_run_as_root",
                              root_cells));
}

enum MHD_Result api_models(struct api_req *r)
{
    return api_json(r, 200,
                    json_pack("{s:O,s:s}", "models", models_table(), "user_models",
                              "package.module:factory, importable only from the build's "
                              "model_roots"));
}

enum MHD_Result api_widths(struct api_req *r)
{
    return api_json(
        r, 200, json_pack("{s:o,s:s}", "widths", widths_table_here(), "host_arch", hostcpu_arch()));
}

/* The host CPU capd read at start (daemon/cpu/hostcpu.h): what decides which
 * widths run here; and how cells' memory is limited (daemon/host/memlimit.h). */
enum MHD_Result api_host(struct api_req *r)
{
    json_t *h = hostcpu_json();
    json_object_set_new(h, "memory", mem_json());
    return api_json(r, 200, h);
}
