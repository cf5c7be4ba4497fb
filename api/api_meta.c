/* api/api_meta.c - GET /healthz, /v1/models, /v1/widths, /v1/host. */
#include "api/api_int.h"
#include "daemon/hostcpu.h"
#include "daemon/widths.h"

enum MHD_Result api_healthz(struct api_req *r)
{
    return api_json(r, 200,
                    json_pack("{s:s,s:s,s:i}", "status", "ok", "version", CAPD_VERSION,
                              "running_cells", (int)capd_running_cells(api_daemon(r))));
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

/* The host CPU capd read at start (daemon/hostcpu.h): what decides which
 * widths run here. */
enum MHD_Result api_host(struct api_req *r)
{
    return api_json(r, 200, hostcpu_json());
}
