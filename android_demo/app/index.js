/**
 * @format
 */

import './src/polyfills'; // before anything that decodes text (the tokenizer)
import { AppRegistry } from 'react-native';
import App from './App';
import { name as appName } from './app.json';

AppRegistry.registerComponent(appName, () => App);
