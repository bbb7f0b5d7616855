/* io_abi.c - what libnibble_io.so adds to the static nibble_io for callers
 * that bind it without a C compiler (the Python package, through ctypes).
 *
 * libnibble_io.so is nibble_io linked whole into a shared library: it
 * exports the functions of safetensors.h, checkpoint.h and ckpt_quantize.h
 * unchanged, and needs libnibble.so (nb_weight_desc_init, nb_quantize_host)
 * and libcjson.  Those headers are internal and their structs may grow, so a
 * binding that mirrors them field by field asks this file first:
 * nb_io_version() must equal the libnibble version it was built with, and
 * nb_io_struct_size() must agree with the sizes of its mirrors; a binding
 * refuses to load on any difference instead of reading past a struct.
 */
#include "checkpoint.h"
#include "ckpt_quantize.h"
#include "io_internal.h"
#include "safetensors.h"

#include <string.h>

#define NB_IO_API __attribute__((visibility("default")))

/* NB_VERSION of the nibble.h this library was compiled against. */
NB_IO_API int nb_io_version(void);
/* sizeof the named struct of the nibble_io headers: "nb_st_tensor",
 * "nb_ckpt_layer", "nb_ckpt_config", "nb_ckpt_quantize_opts",
 * "nb_ckpt_quantize_summary", or "nb_weight_desc" (nibble.h, which
 * nb_ckpt_layer_weight fills).  NB_ERR_NOT_FOUND for another name. */
NB_IO_API nb_status nb_io_struct_size(const char *name, size_t *size, char *err, size_t errlen);

int nb_io_version(void) { return NB_VERSION; }

nb_status nb_io_struct_size(const char *name, size_t *size, char *err, size_t errlen) {
    if (!name || !size) return nbio_fail(err, errlen, NB_ERR_NULL_POINTER, "nb_io_struct_size: NULL argument");
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        {"nb_st_tensor", sizeof(nb_st_tensor)},
        {"nb_ckpt_layer", sizeof(nb_ckpt_layer)},
        {"nb_ckpt_config", sizeof(nb_ckpt_config)},
        {"nb_ckpt_quantize_opts", sizeof(nb_ckpt_quantize_opts)},
        {"nb_ckpt_quantize_summary", sizeof(nb_ckpt_quantize_summary)},
        {"nb_weight_desc", sizeof(nb_weight_desc)},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(sizes[i].name, name)) {
            *size = sizes[i].size;
            return NB_OK;
        }
    return nbio_fail(err, errlen, NB_ERR_NOT_FOUND, "nb_io_struct_size: no struct named \"%s\"", name);
}
