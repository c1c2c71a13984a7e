"""android_demo/app: the React Native app's JS bundle for Android builds here, with the engine inside.

`npm run bundle:android` is what Gradle's release build runs (react-native bundle, Metro), so this
catches a Metro config that cannot reach ../engine/src or the packages it imports, a dependency
missing from the app's package.json, and syntax Hermes would reject (the bundle is compiled by the
hermesc that react-native ships, as the release build does). It also checks that npm ci patched
onnxruntime-react-native's native tensor code (see android_demo/app/scripts/). No Android SDK is
needed; the native build, install and run on a phone are not covered (android_demo/README.md)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the React Native bundle

APP = Path(__file__).resolve().parent.parent / "android_demo" / "app"
BUNDLE = APP / "build" / "index.android.bundle"
HERMESC = APP / "node_modules" / "react-native" / "sdks" / "hermesc" / "linux64-bin" / "hermesc"

# Strings that survive minification (property names, native module names): each proves a part is in.
MARKERS = {
    "kv_pairs": "the engine (manifest.io.kv_pairs)",
    "min_step_rows": "the engine (manifest.min_step_rows)",
    "ByteLevel": "@huggingface/tokenizers",
    "Onnxruntime": "onnxruntime-react-native (NativeModules.Onnxruntime)",
    "RNFSManager": "react-native-fs",
    "TextDecoder": "the app's TextDecoder polyfill / tokenizers.js",
    "/recall": "the app's recall store file (src/recallFile.ts, its SHA-256 from @noble/hashes)",
}


@pytest.fixture(scope="module")
def bundle() -> str:
    if not (APP / "node_modules").is_dir():
        pytest.fail("android_demo/app/node_modules is missing: run `make js-setup` (npm ci in android_demo/*)")
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH: install Node 20 (>= 20.19.4) and run `make js-setup`")
    BUNDLE.unlink(missing_ok=True)
    result = subprocess.run([npm, "run", "bundle:android"], cwd=APP, env={**os.environ, "CI": "true"},
                            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"npm run bundle:android exited {result.returncode}:\n"
                                    f"{(result.stdout + result.stderr)[-4000:]}")
    assert BUNDLE.is_file(), f"{BUNDLE} was not written"
    return BUNDLE.read_text(encoding="utf-8")


def test_bundle_builds_with_the_engine_inside(bundle):
    assert len(bundle) > 500_000, f"the bundle is only {len(bundle)} characters"
    missing = [f"{marker!r} ({what})" for marker, what in MARKERS.items() if marker not in bundle]
    assert not missing, f"not in the bundle: {', '.join(missing)}"


@pytest.mark.skipif(not (platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")),
                    reason="react-native ships hermesc for linux x86_64, macOS and Windows; "
                           "this test runs the Linux one")
def test_hermes_compiles_the_bundle(bundle, tmp_path):
    """What the release build does next: Hermes bytecode (regex literals included, checked at compile time)."""
    result = subprocess.run([str(HERMESC), "-emit-binary", "-O", "-w", "-out", str(tmp_path / "bundle.hbc"),
                             str(BUNDLE)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"hermesc exited {result.returncode}:\n{result.stderr[-4000:]}"
    assert (tmp_path / "bundle.hbc").stat().st_size > 500_000


def test_onnxruntime_react_native_tensors_honour_byte_offset():
    """npm ci's postinstall patched onnxruntime-react-native 1.24.3's TensorUtils.cpp (scripts/patch-...js):
    unpatched, every arena view but the first would hand ONNX Runtime the wrong bytes on the phone."""
    source = APP / "node_modules" / "onnxruntime-react-native" / "cpp" / "TensorUtils.cpp"
    if not source.is_file():
        pytest.fail("android_demo/app/node_modules is missing: run `make js-setup` (npm ci in android_demo/*)")
    assert '"byteOffset"' in source.read_text(encoding="utf-8"), \
        f"{source} is unpatched: run `npm ci` in android_demo/app (its postinstall applies the fix)"
