/**
 * npm postinstall: one fix to onnxruntime-react-native 1.24.3's native code, applied in
 * node_modules before Gradle compiles it (idempotent; no download).
 *
 * cpp/TensorUtils.cpp createOrtValueFromJSTensor hands ONNX Runtime `buffer.data()`, the start of
 * the tensor's ArrayBuffer, and ignores the typed array's byteOffset. The engine carves every step
 * tensor and the KV cache out of one ArrayBuffer (engine/src/arena.ts), so all tensors but the one
 * at offset 0 would read and write the wrong bytes. The fix adds the offset.
 */
'use strict';

const fs = require('fs');
const path = require('path');

const VERSION = '1.24.3';
const BEFORE = '    data = buffer.data(runtime);\n';
const AFTER =
  '    data = buffer.data(runtime) +  // patched by SpecMemo: a view into a larger buffer starts at its byteOffset\n' +
  '           static_cast<size_t>(dataObj.getProperty(runtime, "byteOffset").asNumber());\n';

let root;
try {
  root = path.dirname(require.resolve('onnxruntime-react-native/package.json'));
} catch {
  process.exit(0); // not installed (e.g. --omit): nothing to patch
}
const version = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).version;
const file = path.join(root, 'cpp', 'TensorUtils.cpp');
const source = fs.readFileSync(file, 'utf8');
if (source.includes(AFTER)) process.exit(0);
if (version !== VERSION || source.split(BEFORE).length !== 2) {
  console.error(`patch-onnxruntime-react-native: written for ${VERSION}, found ${version} whose cpp/TensorUtils.cpp ` +
    'does not have the expected line: check whether it still ignores byteOffset, then update or drop this script');
  process.exit(1);
}
fs.writeFileSync(file, source.replace(BEFORE, AFTER));
console.log(`patch-onnxruntime-react-native: ${path.relative(process.cwd(), file)} now honours byteOffset`);
