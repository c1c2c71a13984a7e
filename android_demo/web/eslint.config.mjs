// ESLint for the page: typescript-eslint's type-aware recommended rules over src/ (the types from tsconfig.json)
// and vite.config.ts, ESLint's recommended rules over the Node scripts (serve.mjs, test/browser.mjs, this file).
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/'] },
  js.configs.recommended,
  {
    files: ['**/*.ts'],
    extends: [tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: {
        projectService: { allowDefaultProject: ['vite.config.ts'] }, // Vite's own config: outside the page's tsconfig
        tsconfigRootDir: import.meta.dirname,
      },
    },
  },
  { files: ['**/*.mjs'], languageOptions: { globals: globals.node } },
  // its page.evaluate callbacks run in the page, beside the Node code that drives it
  { files: ['test/browser.mjs'], languageOptions: { globals: { ...globals.node, ...globals.browser } } },
);
