/*
 * api/api_devices.c - /v1/devices: the GPUs capd found, and a refresh.
 *
 * The list comes from the daemon (daemon/host/devices.h), which read it from the
 * probe child capd-gpuinfo; nothing here touches a GPU runtime. A host
 * without a GPU answers 200 with an empty list and the reason.
 */
#include "api/api_int.h"
#include "daemon/host/devices.h"

enum MHD_Result api_devices_list(struct api_req *r)
{
    json_t *out = devices_json(capd_devices(api_daemon(r)));
    if (!out)
        return api_error(r, 500, "internal", NULL, "the device list could not be encoded");
    return api_json(r, 200, out);
}

/*
 * Runs the probe again (a GPU was added, a driver was loaded). HTTP never
 * waits on a child: the reply is 202 with the generation of the list as it
 * is now; GET /v1/devices shows a higher "generation" once the new probe
 * has answered. The body, if any, is ignored.
 */
enum MHD_Result api_devices_refresh(struct api_req *r)
{
    struct capd *d = api_daemon(r);
    json_t *now = devices_json(capd_devices(d));
    json_t *gen = json_object_get(now, "generation");
    json_t *out = json_pack("{s:b,s:O}", "refreshing", 1, "generation", gen ? gen : json_null());
    json_decref(now);
    if (!out)
        return api_error(r, 500, "internal", NULL, "the reply could not be encoded");
    capd_notify_devices_refresh(d);
    return api_json(r, 202, out);
}
