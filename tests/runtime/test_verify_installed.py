"""`vllm-overlay verify --installed` on the patched build installed in the
release's test environment: each file it installed is the one a rebuild from
the pinned upstream wheel and the checkout's series gives (pip's console
script and install-time files aside)."""

from vllm_overlay.wheel.verify import verify_installed


def test_the_installed_patched_build_is_its_rebuild():
    check = verify_installed()
    assert check.differences == ()
    assert check.identical
