/**
 * Metro for the app and the shared engine beside it (../engine/src, TypeScript, no build step):
 *   - `@specmemo/engine` is ../engine/src/index.ts;
 *   - ../engine is watched, so its files can be bundled although they lie outside this folder;
 *   - every package the engine imports (@huggingface/tokenizers, @huggingface/jinja) resolves from
 *     this app's node_modules, never from ../engine/node_modules (that one is for Node and tests);
 *   - .mjs/.cjs: @huggingface/tokenizers ships dist/tokenizers.mjs.
 * https://reactnative.dev/docs/metro
 */
const path = require('path');
const { getDefaultConfig, mergeConfig } = require('@react-native/metro-config');

const engineDir = path.resolve(__dirname, '../engine');
const engineEntry = path.join(engineDir, 'src/index.ts');
const appEntry = path.join(__dirname, 'index.js');

const defaults = getDefaultConfig(__dirname);
const escape = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** @type {import('@react-native/metro-config').MetroConfig} */
const config = {
  watchFolders: [engineDir],
  resolver: {
    sourceExts: [...defaults.resolver.sourceExts, 'mjs', 'cjs'],
    nodeModulesPaths: [path.resolve(__dirname, 'node_modules')],
    // not crawled: the engine's own installs and build output
    blockList: [
      ...[].concat(defaults.resolver.blockList ?? []),
      new RegExp(`^${escape(engineDir)}[/\\\\](node_modules|dist)[/\\\\].*`),
    ],
    resolveRequest(context, moduleName, platform) {
      if (moduleName === '@specmemo/engine') return { type: 'sourceFile', filePath: engineEntry };
      const bare = !moduleName.startsWith('.') && !path.isAbsolute(moduleName);
      if (bare && context.originModulePath.startsWith(engineDir + path.sep)) {
        // a package imported by the engine: look it up as if this app had imported it
        return context.resolveRequest({ ...context, originModulePath: appEntry }, moduleName, platform);
      }
      return context.resolveRequest(context, moduleName, platform);
    },
  },
};

module.exports = mergeConfig(defaults, config);
