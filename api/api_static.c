/*
 * api/api_static.c - the web dashboard: GET / and GET /static/{file}.
 *
 * The files of web/ are compiled into the binary (cmake/embed.cmake),
 * so an installed capd serves its dashboard with no path to configure and
 * no network: no CDN, no fonts, no build step. They are public even when
 * reads need a token (api/auth.c): they hold no data, and the page asks
 * for the token it then sends with every API call.
 *
 * Replies carry an ETag (a hash of the file, computed once) and
 * Cache-Control: no-cache, so a browser revalidates and an upgraded capd's
 * dashboard is picked up at once; and a Content-Security-Policy that
 * allows nothing but this origin.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"

struct api_web_file {
    const char *name;
    const char *data;
    size_t size;
};
extern const struct api_web_file api_web_files[];

#define WEB_MAX_FILES 64

static char etags[WEB_MAX_FILES][24];
static pthread_once_t etag_once = PTHREAD_ONCE_INIT;

static void etags_init(void)
{
    for (int i = 0; api_web_files[i].name && i < WEB_MAX_FILES; i++) {
        uint64_t h = 1469598103934665603ULL;
        for (size_t k = 0; k < api_web_files[i].size; k++)
            h = (h ^ (unsigned char)api_web_files[i].data[k]) * 1099511628211ULL;
        snprintf(etags[i], sizeof etags[i], "w%016llx", (unsigned long long)h);
    }
}

static const char *content_type(const char *name)
{
    static const struct {
        const char *ext, *type;
    } types[] = {{".html", "text/html; charset=utf-8"},
                 {".js", "text/javascript; charset=utf-8"},
                 {".css", "text/css; charset=utf-8"},
                 {".svg", "image/svg+xml"},
                 {".png", "image/png"},
                 {".ico", "image/x-icon"},
                 {".json", "application/json"}};
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}

static enum MHD_Result serve(struct api_req *r, const char *name)
{
    pthread_once(&etag_once, etags_init);
    int i = 0;
    while (api_web_files[i].name && strcmp(api_web_files[i].name, name) != 0)
        i++;
    if (!api_web_files[i].name || i >= WEB_MAX_FILES)
        return api_error(r, 404, "not_found", NULL, "no such file");
    api_set_etag(r, "%s", etags[i]);
    if (api_if_none_match(r))
        return api_not_modified(r);
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        api_web_files[i].size, (void *)api_web_files[i].data, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", content_type(name));
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "ETag", r->etag);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; "
                            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    r->status = 200;
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result api_static_index(struct api_req *r)
{
    return serve(r, "index.html");
}

enum MHD_Result api_static_file(struct api_req *r)
{
    return serve(r, api_param(r, "file")); /* /static/:file */
}
