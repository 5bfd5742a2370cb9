"""What doctor reads from the installed vLLM's files rather than its objects.

Some failures depend on how a release's code is laid out, not on anything its
configuration objects show: which Triton kernel a step launches first, or
whether the CPU platform's C++ stand-ins for Triton kernels reach the code
that launches them. Reading the installed files (found without importing the
modules) makes a finding cite the release that is installed, pinned or not,
instead of a table someone must extend at every pin.
"""

import ast
import importlib.util
from pathlib import Path

# The Triton kernels a speculating hybrid model with prefix caching launches
# first, newest first: from 0.30.0 the pre-copy at every step; 0.22.1, which
# has none, the post-process after the first step.
MAMBA_KERNELS = ("precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel")
MAMBA_UTILS = "vllm.v1.worker.mamba_utils"
REJECTION_SAMPLER = "vllm.v1.sample.rejection_sampler"
CPU_PLATFORM = "vllm.platforms.cpu"
CONV_STATE_LAYOUT = "VLLM_SSM_CONV_STATE_LAYOUT"


def _source(module: str) -> str | None:
    """The installed text of `module`; None when vLLM has no such file."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).read_text(encoding="utf-8")


def mamba_kernel_launch() -> tuple[str, int] | None:
    """The first of MAMBA_KERNELS the installed vLLM launches
    (`KERNEL[grid](`) in v1/worker/mamba_utils.py, and that line."""
    source = _source(MAMBA_UTILS)
    if source is None:
        return None
    lines = source.splitlines()
    for kernel in MAMBA_KERNELS:
        for number, line in enumerate(lines, start=1):
            if line.strip() == f"{kernel}[grid](":
                return kernel, number
    return None


def cpu_speculation_kernels() -> bool | None:
    """Whether the CPU platform's stand-ins for speculative decoding's Triton
    kernels reach the code that launches them; None: the files are not there.

    0.30.0 wraps each of those kernels, the rejection sampler's among them
    (v1/sample/rejection_sampler.py:800-803), in
    `triton_kernel_dispatcher_with_warmup`, which keeps the kernel it was
    given at import: without Triton, a placeholder function. The CPU model
    runner swaps only the modules' attributes (cpu_model_runner.py:65-110), so
    the first speculative step fails in the dispatcher ("Cannot inspect
    kernel parameters"). From 0.31.0 the platform registers the stand-ins
    with the dispatcher itself (`register_triton_kernel_overrides`,
    platforms/cpu.py:651 in 0.31.0); 0.22.1 has no dispatcher and looks each
    kernel up at its launch."""
    sampler, platform = _source(REJECTION_SAMPLER), _source(CPU_PLATFORM)
    if sampler is None or platform is None:
        return None
    if "triton_kernel_dispatcher_with_warmup(" not in sampler:
        return True
    return "def register_triton_kernel_overrides(" in platform


# vLLM 0.34.0's CPU platform refuses an x86 CPU without triton-cpu, in these
# words (vllm/platforms/cpu.py:241-243 there).
TRITON_CPU_MISSING = "requires Triton (triton-cpu)"


def cpu_requires_triton() -> bool | None:
    """Whether the installed CPU platform refuses an x86 CPU without
    triton-cpu (0.34.0), so that a configuration it builds there runs Triton
    kernels through triton-cpu; None: the file is not there. Before, vLLM's
    CPU platform ran without Triton, where `triton.jit` leaves plain
    functions that a launch cannot subscript."""
    source = _source(CPU_PLATFORM)
    return None if source is None else TRITON_CPU_MISSING in source


def conv_state_forced_sd() -> str | None:
    """The `torch.cpu` check (`_is_avx512_bf16_supported`, ...) after which
    the installed CPU platform sets VLLM_SSM_CONV_STATE_LAYOUT to SD whatever
    the user set; None: it never overrides a layout the user set.

    NIXL's worker refuses a hybrid model unless the conv state is dim-first
    ("3-read Mamba conv transfer requires DS conv state layout. Set
    VLLM_SSM_CONV_STATE_LAYOUT=DS"), so on a CPU that passes the check a
    hybrid model never starts with NixlConnector, whatever the user sets:
    0.30.0 forces SD on AVX-512 BF16 (platforms/cpu.py:403-404), 0.22.1 on
    AMX tiles (:229-231); from 0.31.0 the platform sets DS for NIXL unless
    the user chose (`if conv_state_layout_env not in os.environ`)."""
    source = _source(CPU_PLATFORM)
    found = None if source is None else forced_sd_check_in(source)
    return None if found is None else found[0]


def forced_sd_check_in(source: str) -> tuple[str, int] | None:
    """In the text of a release's platforms/cpu.py, the `torch.cpu` check
    after which it forces the SD layout whatever the user set, and its line
    (`conv_state_forced_sd`); None: there is none."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.If):
            guarded = guarded or "os.environ" in ast.unparse(node.test)
            check = node.test.func if isinstance(node.test, ast.Call) else None
            if (
                not guarded
                and isinstance(check, ast.Attribute)
                and ast.unparse(check.value) == "torch.cpu"
                and any(_sets_sd(statement) for statement in node.body)
            ):
                found.append((check.attr, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(source), guarded=False)
    return found[0] if found else None


def _sets_sd(statement: ast.stmt) -> bool:
    """`os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"`."""
    return (
        isinstance(statement, ast.Assign)
        and ast.unparse(statement.targets[0]) == f"os.environ[{CONV_STATE_LAYOUT!r}]"
        and isinstance(statement.value, ast.Constant)
        and statement.value.value == "SD"
    )
