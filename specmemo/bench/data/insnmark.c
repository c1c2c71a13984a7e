/* Instruction counter for qemu-user (QEMU 7.2 plugin API): every executed guest instruction adds 1 to one
 * global counter (inline, like tests/plugin/insn.c with inline=on), and a guest syscall numbered MARK_SYSCALL
 * (no such syscall on aarch64: QEMU returns -ENOSYS) prints "mark <a1>: <count so far>", so a program can
 * bracket a region of itself: syscall(4000, 1) ... syscall(4000, 2). "insns: <total>" at exit, as insn.c. */
#include <inttypes.h>
#include <stdio.h>
#include <glib.h>
#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MARK_SYSCALL 4000
static uint64_t count;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        qemu_plugin_register_vcpu_insn_exec_inline(qemu_plugin_tb_get_insn(tb, i),
                                                   QEMU_PLUGIN_INLINE_ADD_U64, &count, 1);
    }
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    if (num == MARK_SYSCALL) {
        g_autofree gchar *out = g_strdup_printf("mark %" PRIu64 ": %" PRIu64 "\n", a1, count);
        qemu_plugin_outs(out);
    }
}

static void plugin_exit(qemu_plugin_id_t id, void *p)
{
    g_autofree gchar *out = g_strdup_printf("insns: %" PRIu64 "\n", count);
    qemu_plugin_outs(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
