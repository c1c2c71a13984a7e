// ESLint for the app: typescript-eslint's type-aware recommended rules and React's rules of hooks over App.tsx and
// src/ (the types from tsconfig.json), ESLint's recommended rules over the JavaScript (index.js, Metro's and
// Babel's configs, scripts/, this file).
import js from '@eslint/js';
import reactHooks from 'eslint-plugin-react-hooks';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'build/', 'android/'] },
  js.configs.recommended,
  {
    files: ['**/*.{ts,tsx}'],
    extends: [tseslint.configs.recommendedTypeChecked, reactHooks.configs.flat.recommended],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
  },
  // Node's CommonJS: Metro's and Babel's configs, the postinstall script
  { files: ['*.config.js', 'scripts/**/*.js'], languageOptions: { sourceType: 'commonjs', globals: globals.node } },
);
