/*
 * tests/test_kernelmap.c - the kernel map capctl derives from a PyTorch
 * source tree (cli/kernelmap.h): the blanking, the registrations, the
 * yaml, the calls, a whole tree on disk with its limits, and the map
 * reaching the provenance of a real git repository.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/kernelmap.c"
#include "cli/provenance.c"
#include "tests/helpers/common/testutil.h"

static const char *jstr_at(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* Blanks and scans a copy of SRC's registrations into a new object. */
static json_t *registrations(const char *src)
{
    char *s = strdup(src);
    json_t *stubs = json_object();
    cr_assert(s && stubs);
    kmap_blank(s, strlen(s));
    cr_assert_eq(kmap_registrations(s, "cpu/X.cpp", stubs), 0);
    free(s);
    return stubs;
}

Test(kernelmap, only_live_registrations_count)
{
    json_t *stubs = registrations(
        "// REGISTER_DISPATCH(commented_stub, &a);\n"
        "/* REGISTER_DISPATCH(block_stub, &b);\n   still a comment */\n"
        "const char *s = \"REGISTER_DISPATCH(string_stub, &c)\"; char q = '\\'';\n"
        "#define REGISTER_DISPATCH(name, fn) \\\n  REGISTER_ARCH_DISPATCH(macro_stub, fn)\n"
        "REGISTER_DISPATCH(GeluKernel, &GeluKernelImpl);\n"
        "ALSO_REGISTER_AVX512_DISPATCH( add_stub , &add_kernel);\n"
        "REGISTER_NO_CPU_DISPATCH(no_cpu_stub);\n"
        "REGISTER_NO_AVX512_DISPATCH(no_avx512_stub);\n"
        "MY_REGISTER_DISPATCH_HELPER(helper_stub);\n");
    cr_assert_eq(json_object_size(stubs), 2, "%s", json_dumps(stubs, 0));
    cr_assert_str_eq(jstr_at(stubs, "GeluKernel"), "cpu/X.cpp");
    cr_assert_str_eq(jstr_at(stubs, "add_stub"), "cpu/X.cpp");
    json_decref(stubs);
}

Test(kernelmap, yaml_cpu_functions_and_delegates)
{
    json_t *fns = json_object();
    cr_assert_eq(kmap_yaml("- func: gelu(Tensor self, *, str approximate='none') -> Tensor\n"
                           "  structured_delegate: gelu.out\n"
                           "  dispatch:\n"
                           "    MkldnnCPU: mkldnn_gelu\n"
                           "    NestedTensorCPU, NestedTensorCUDA: NestedTensor_gelu\n"
                           "  tags: [core, pointwise]\n"
                           "\n"
                           "- func: gelu.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)\n"
                           "  structured: True\n"
                           "  dispatch:\n"
                           "    CPU: gelu_out_cpu\n"
                           "    CUDA: gelu_out_cuda\n"
                           "# a comment\n"
                           "- func: relu(Tensor self) -> Tensor\n"
                           "  dispatch:\n"
                           "    CPU, CUDA: relu\n"
                           "    QuantizedCPU: relu_quantized_cpu\n"
                           "- func: silu(Tensor self) -> Tensor\n"
                           "  structured_delegate: silu_impl.out\n"
                           "- func: silu_impl.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)\n"
                           "  dispatch:\n"
                           "    CPU: silu_out_cpu\n"
                           "- func: cpu_only_in_a_tag(Tensor self) -> Tensor\n"
                           "  tags: CPU\n",
                           fns),
                 0);
    char *d = json_dumps(fns, JSON_SORT_KEYS);
    cr_assert_str_eq(d, "{\"gelu\": [\"gelu_out_cpu\"], \"relu\": [\"relu\"], \"silu\": "
                        "[\"silu_out_cpu\"], \"silu_impl\": [\"silu_out_cpu\"]}");
    free(d);
    json_decref(fns);
}

Test(kernelmap, calls_are_read_from_definitions_only)
{
    char *src = strdup("Tensor gelu_out_cpu(const Tensor& self);  // a declaration\n"
                       "void other() { gelu_out_cpu(x); add_stub(kCPU, it); }\n"
                       "TORCH_IMPL_FUNC(gelu_out_cpu) (const Tensor& self, const Tensor& r) {\n"
                       "  if (x) { GeluKernel(kCPU, *this); }\n"
                       "  auto s = \"add_stub(kCPU)\";\n"
                       "  GeluKernel (kCPU, *this); GeluKernel_helper(kCPU);\n"
                       "}\n"
                       "Tensor& relu_(Tensor& self) const noexcept {\n"
                       "  return add_stub(kCPU, self), not_a_stub(self);\n"
                       "}\n");
    json_t *wanted = json_pack("{s:b, s:b}", "gelu_out_cpu", 1, "relu_", 1);
    json_t *stubs = json_pack("{s:s, s:s}", "GeluKernel", "f1", "add_stub", "f2");
    json_t *calls = json_object();
    kmap_blank(src, strlen(src));
    cr_assert_eq(kmap_calls(src, wanted, stubs, calls), 0);
    char *d = json_dumps(calls, JSON_SORT_KEYS);
    cr_assert_str_eq(d, "{\"gelu_out_cpu\": [\"GeluKernel\"], \"relu_\": [\"add_stub\"]}");
    free(d);
    free(src);
    json_decref(wanted);
    json_decref(stubs);
    json_decref(calls);
}

/* ---- a tree on disk ---- */

static void put_file(const char *dir, const char *rel, const char *text)
{
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s", dir, rel) > 0);
    cr_assert_eq(tu_sh("mkdir -p \"$(dirname '%s')\"", p), 0);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
    free(p);
}

#define YAML                                                                                       \
    "- func: gelu(Tensor self) -> Tensor\n  structured_delegate: gelu.out\n"                       \
    "- func: gelu.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)\n"                             \
    "  dispatch:\n    CPU: gelu_out_cpu\n"                                                         \
    "- func: mm(Tensor self, Tensor mat2) -> Tensor\n  dispatch:\n    CPU: mm_cpu\n"

/* A small aten tree under DIR/PREFIX: gelu calls a registered stub, mm
 * (BLAS, no stub) does not, a wrapper registers a stub of its own. */
static void small_tree(const char *dir, const char *prefix)
{
    char rel[512];
#define AT(x) (snprintf(rel, sizeof rel, "%s%s", prefix, "aten/src/ATen/native/" x), rel)
    put_file(dir, AT("native_functions.yaml"), YAML);
    put_file(dir, AT("Activation.cpp"),
             "TORCH_IMPL_FUNC(gelu_out_cpu)(const Tensor& self, const Tensor& r) {\n"
             "  GeluKernel(kCPU, *this);\n}\n");
    put_file(dir, AT("Blas.cpp"), "Tensor mm_cpu(const Tensor& a) { return at::addmm(a); }\n");
    put_file(dir, AT("cpu/Activation.cpp"),
             "static void gelu_kernel(TensorIteratorBase& it) {}\n"
             "// REGISTER_DISPATCH(GeluKernel, &old_gelu_kernel);\n"
             "REGISTER_DISPATCH(GeluKernel, &gelu_kernel);\n");
    put_file(dir, AT("cpu/Activation.cpp.AVX2.cpp"), "REGISTER_DISPATCH(WrapperOnly, &w);\n");
#undef AT
}

Test(kernelmap, a_tree_one_level_down)
{
    char *dir = tu_tmpdir();
    small_tree(dir, "pytorch/");
    json_t *map = NULL;
    char *err = NULL;
    cr_assert_eq(kmap_scan(dir, &map, &err), 0, "%s", err ? err : "");
    cr_assert_not_null(map);
    cr_assert_str_eq(jstr_at(map, "root"), "pytorch/aten/src/ATen/native");
    json_t *ops = json_object_get(map, "ops");
    cr_assert_eq(json_object_size(ops), 1, "%s", json_dumps(map, 0));
    json_t *g = json_object_get(ops, "aten::gelu");
    cr_assert_str_eq(jstr_at(g, "kind"), "stub");
    cr_assert_str_eq(jstr_at(g, "stub"), "GeluKernel");
    cr_assert_str_eq(jstr_at(g, "file"), "pytorch/aten/src/ATen/native/cpu/Activation.cpp");
    cr_assert_str_eq(jstr_at(g, "cpu_function"), "gelu_out_cpu");
    cr_assert_null(json_object_get(ops, "aten::mm"), "mm calls no stub");
    cr_assert_eq(json_integer_value(json_object_get(map, "stubs_registered")), 1,
                 "the wrapper's registration is not the tree's");
    cr_assert_eq(json_integer_value(json_object_get(map, "files_scanned")), 3);
    cr_assert_eq(json_integer_value(json_object_get(map, "files_skipped")), 0);
    cr_assert(json_is_false(json_object_get(map, "ops_truncated")));
    json_decref(map);

    /* A tree that is no PyTorch has no map, and that is no error. */
    char *other = tu_tmpdir();
    put_file(other, "src/main.c", "int main(void) { return 0; }\n");
    cr_assert_eq(kmap_scan(other, &map, &err), 0);
    cr_assert_null(map);
    tu_sh("rm -rf '%s' '%s'", dir, other);
    free(dir);
    free(other);
}

Test(kernelmap, missing_yaml_and_too_big_files_are_said)
{
    char *dir = tu_tmpdir();
    small_tree(dir, "");
    cr_assert_eq(tu_sh("rm '%s/aten/src/ATen/native/native_functions.yaml' && "
                       "truncate -s %u '%s/aten/src/ATen/native/Huge.cpp'",
                       dir, KMAP_MAX_FILE_BYTES + 1, dir),
                 0);
    json_t *map = NULL;
    char *err = NULL;
    cr_assert_eq(kmap_scan(dir, &map, &err), 0);
    cr_assert_eq(json_object_size(json_object_get(map, "ops")), 0);
    cr_assert(strstr(jstr_at(map, "note"), "native_functions.yaml"), "%s", jstr_at(map, "note"));
    json_decref(map);

    /* with the yaml back, the huge file is skipped and counted, gelu still mapped */
    put_file(dir, "aten/src/ATen/native/native_functions.yaml", YAML);
    cr_assert_eq(kmap_scan(dir, &map, &err), 0);
    cr_assert_eq(json_integer_value(json_object_get(map, "files_skipped")), 1);
    cr_assert_not_null(json_object_get(json_object_get(map, "ops"), "aten::gelu"));
    json_decref(map);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* KMAP_MAX_OPS + 1 ops that each call a stub: the map keeps KMAP_MAX_OPS
 * and says it was cut; KMAP_MAX_FILES + 1 sources: one is skipped. */
Test(kernelmap, ops_and_files_past_their_limits, .timeout = 60)
{
    char *dir = tu_tmpdir();
    const int n = KMAP_MAX_OPS + 1, files = KMAP_MAX_FILES + 1 - 2;
    cr_assert_eq(tu_sh("mkdir -p '%s/aten/src/ATen/native/cpu'", dir), 0);
    char *yaml = NULL, *defs = NULL, *regs = NULL;
    size_t ly = 0, ld = 0, lr = 0;
    FILE *fy = open_memstream(&yaml, &ly), *fd = open_memstream(&defs, &ld),
         *fr = open_memstream(&regs, &lr);
    for (int i = 0; i < n; i++) {
        fprintf(fy, "- func: op%04d(Tensor self) -> Tensor\n  dispatch:\n    CPU: op%04d_cpu\n", i,
                i);
        fprintf(fd, "Tensor op%04d_cpu(const Tensor& s) { stub%04d(kCPU, s); }\n", i, i);
        fprintf(fr, "REGISTER_DISPATCH(stub%04d, &k%04d);\n", i, i);
    }
    fclose(fy);
    fclose(fd);
    fclose(fr);
    put_file(dir, "aten/src/ATen/native/native_functions.yaml", yaml);
    put_file(dir, "aten/src/ATen/native/Ops.cpp", defs);
    put_file(dir, "aten/src/ATen/native/cpu/Kernels.cpp", regs);
    /* Ops.cpp and Kernels.cpp plus fillers: one more than KMAP_MAX_FILES. The
     * fillers sort after Ops.cpp, so the one skipped is a filler. */
    cr_assert_eq(tu_sh("cd '%s/aten/src/ATen/native' && for i in $(seq -w 1 %d); do "
                       ": > \"Z$i.cpp\"; done",
                       dir, files),
                 0);
    json_t *map = NULL;
    char *err = NULL;
    cr_assert_eq(kmap_scan(dir, &map, &err), 0, "%s", err ? err : "");
    cr_assert_eq(json_object_size(json_object_get(map, "ops")), KMAP_MAX_OPS);
    cr_assert_eq(json_integer_value(json_object_get(map, "ops_total")), n);
    cr_assert(json_is_true(json_object_get(map, "ops_truncated")));
    cr_assert_str_eq(jstr_at(json_object_get(json_object_get(map, "ops"), "aten::op0000"), "stub"),
                     "stub0000");
    cr_assert_eq(json_integer_value(json_object_get(map, "files_scanned")), KMAP_MAX_FILES);
    cr_assert_eq(json_integer_value(json_object_get(map, "files_skipped")), 1);
    json_decref(map);
    free(yaml);
    free(defs);
    free(regs);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* The map rides in the provenance that prov_collect builds from a real git
 * repository, next to the stale wrapper it finds. */
Test(kernelmap, provenance_of_a_git_tree_carries_the_map, .timeout = 60)
{
    char *dir = tu_tmpdir();
    small_tree(dir, "");
    cr_assert_eq(tu_sh("cd '%s' && git init -q && git add aten/src/ATen/native/*.cpp "
                       "aten/src/ATen/native/cpu/Activation.cpp "
                       "aten/src/ATen/native/native_functions.yaml && "
                       "git -c user.email=t@t -c user.name=t commit -qm init",
                       dir),
                 0);
    json_t *prov = NULL;
    char *err = NULL;
    cr_assert_eq(prov_collect(dir, &prov, &err), 0, "%s", err ? err : "");
    json_t *map = json_object_get(prov, "kernel_map");
    cr_assert_str_eq(jstr_at(json_object_get(json_object_get(map, "ops"), "aten::gelu"), "file"),
                     "aten/src/ATen/native/cpu/Activation.cpp");
    cr_assert_eq(json_array_size(json_object_get(prov, "findings")), 1,
                 "the untracked wrapper is a finding");
    json_decref(prov);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
