/**
 * SpecMemo chat: pick an artifact folder on the phone, open it with the shared engine over
 * onnxruntime-react-native, chat with it (one ChatSession: later turns reuse the KV positions of
 * the earlier ones). With "remember" on, the engine drafts from a recall store of every earlier turn
 * and conversation, kept in the app's files per artifact (src/recallFile.ts); Forget empties it.
 */

import React, { useCallback, useEffect, useRef, useState } from 'react';
import {
  ActivityIndicator,
  FlatList,
  KeyboardAvoidingView,
  Platform,
  Pressable,
  StatusBar,
  StyleSheet,
  Text,
  TextInput,
  View,
} from 'react-native';
import { SafeAreaProvider, SafeAreaView } from 'react-native-safe-area-context';
import * as ort from 'onnxruntime-react-native';

import { ChatSession, openEngine } from '@specmemo/engine';
import { MODES } from '@specmemo/engine'; // the drafting modes, as the engine names them
import type { Engine, Mode, Reply } from '@specmemo/engine';

import { RecallFileOnPhone, digest } from './src/recallFile';
import { ARTIFACTS_DIR, DeviceSource, listArtifacts } from './src/source';
import type { ArtifactEntry } from './src/source';

type FormatChoice = 'auto' | 'onnx' | 'ort';
const FORMATS: FormatChoice[] = ['auto', 'ort', 'onnx'];
const REMEMBER: boolean[] = [false, true]; // the recall store: off unless chosen (it keeps what was typed, on the phone)
// how tokens are chosen: by the artifact's own sampling settings (as `specmemo chat`), or argmax on request
const DECODING = ['sample', 'greedy'] as const;
type Decoding = (typeof DECODING)[number];

interface Message {
  id: number;
  role: 'user' | 'assistant' | 'error';
  text: string;
  stats?: string;
}

interface Loaded {
  artifact: ArtifactEntry;
  engine: Engine;
  session: ChatSession;
  format: 'onnx' | 'ort';
}

function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

/** 'ort' where the artifact was exported with --mobile (its manifest lists .ort graphs), else 'onnx'. */
function resolveFormat(choice: FormatChoice, artifact: ArtifactEntry): 'onnx' | 'ort' {
  return choice === 'auto' ? (artifact.hasOrt ? 'ort' : 'onnx') : choice;
}

function statsLine(reply: Reply, session: ChatSession, engine: Engine): string {
  const s = reply.stats;
  const trees = s.treeSizes;
  const lastT = trees.length ? trees[trees.length - 1] : 0;
  const meanT = trees.length ? trees.reduce((a, b) => a + b, 0) / trees.length : 0;
  const parts = [
    `${s.newTokens} tok, ${s.decodeTokensPerS.toFixed(1)} tok/s`,
    `${s.meanAccepted.toFixed(2)} accepted/step`,
    `T ${lastT} last / ${meanT.toFixed(1)} avg`,
    `KV ${session.kvUsed()}/${session.capacity}`,
    `reused ${reply.reused}, prefilled ${reply.prefilled}`,
  ];
  if (reply.dropped) parts.push(`dropped ${reply.dropped} old turn(s)`);
  parts.push(reply.interrupted ? 'stopped' : s.finishReason);
  return `${parts.join(' · ')}\n${engine.plan.summary}`;
}

function Chip(props: { label: string; active: boolean; onPress: () => void }) {
  return (
    <Pressable onPress={props.onPress} style={[styles.chip, props.active && styles.chipActive]}>
      <Text style={props.active ? styles.chipTextActive : styles.chipText}>{props.label}</Text>
    </Pressable>
  );
}

function Button(props: { label: string; onPress: () => void; disabled?: boolean; danger?: boolean }) {
  return (
    <Pressable
      onPress={props.onPress}
      disabled={props.disabled}
      style={[styles.button, props.danger && styles.buttonDanger, props.disabled && styles.buttonDisabled]}>
      <Text style={styles.buttonText}>{props.label}</Text>
    </Pressable>
  );
}

/** The recall store's line: tokens held of its capacity, its bytes. */
function recallLine(engine: Engine): string {
  const store = engine.recall;
  return store === null ? '' : ` · recall ${store.held}/${store.capacity} tokens, ${(store.nbytes / 2 ** 20).toFixed(1)} MiB`;
}

function Picker(props: { onOpen: (artifact: ArtifactEntry, mode: Mode, format: FormatChoice, remember: boolean, decoding: Decoding) => void }) {
  const [artifacts, setArtifacts] = useState<ArtifactEntry[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [mode, setMode] = useState<Mode>('auto');
  const [format, setFormat] = useState<FormatChoice>('auto');
  const [remember, setRemember] = useState(false);
  const [decoding, setDecoding] = useState<Decoding>('sample');

  // state set in the listing's callbacks only (an effect that sets state at once renders twice)
  const listFolder = useCallback(() => listArtifacts().then(setArtifacts, (err: unknown) => setError(errorText(err))), []);
  useEffect(() => {
    void listFolder();
  }, [listFolder]);
  const refresh = () => {
    setError(null);
    void listFolder();
  };

  return (
    <View style={styles.fill}>
      <Text style={styles.title}>SpecMemo chat</Text>
      <Text style={styles.muted}>Artifacts in {ARTIFACTS_DIR}</Text>
      <View style={styles.row}>
        <Text style={styles.label}>mode</Text>
        {MODES.map((m) => <Chip key={m} label={m} active={mode === m} onPress={() => setMode(m)} />)}
      </View>
      <View style={styles.row}>
        <Text style={styles.label}>tokens</Text>
        {DECODING.map((d) => <Chip key={d} label={d} active={decoding === d} onPress={() => setDecoding(d)} />)}
      </View>
      <View style={styles.row}>
        <Text style={styles.label}>graphs</Text>
        {FORMATS.map((f) => <Chip key={f} label={f} active={format === f} onPress={() => setFormat(f)} />)}
      </View>
      <View style={styles.row}>
        <Text style={styles.label}>recall</Text>
        {REMEMBER.map((r) => <Chip key={String(r)} label={r ? 'remember' : 'off'} active={remember === r} onPress={() => setRemember(r)} />)}
      </View>
      {error !== null && <Text style={styles.error}>{error}</Text>}
      {artifacts === null && error === null && <ActivityIndicator />}
      <FlatList
        data={artifacts ?? []}
        keyExtractor={(a) => a.name}
        ListEmptyComponent={artifacts === null ? null : (
          <Text style={styles.hint}>
            {'No artifact here yet. On a computer, in the SpecMemo repository:\n'}
            {'  specmemo export --dtype int4 --mobile arm\n'}
            {`  adb push artifacts/smollm2-135m-int4 ${ARTIFACTS_DIR}/\n`}
            {'then tap Refresh.'}
          </Text>
        )}
        renderItem={({ item }) => (
          <Pressable
            disabled={item.problem !== null}
            onPress={() => props.onOpen(item, mode, format, remember, decoding)}
            style={[styles.artifact, item.problem !== null && styles.buttonDisabled]}>
            <Text style={styles.artifactName}>{item.name}</Text>
            <Text style={styles.muted}>
              {item.problem ?? `opens as ${resolveFormat(format, item)}${item.hasOrt ? ' (has .ort graphs)' : ''}`}
            </Text>
          </Pressable>
        )}
      />
      <Button label="Refresh" onPress={refresh} />
    </View>
  );
}

function Chat(props: { loaded: Loaded; lastLog: string; onClose: () => void }) {
  const { artifact, engine, session, format } = props.loaded;
  const [messages, setMessages] = useState<Message[]>([]);
  const [input, setInput] = useState('');
  const [busy, setBusy] = useState(false);
  const [status, setStatus] = useState(`${format} graphs · mode ${engine.mode} · ${engine.plan.summary}${recallLine(engine)}`);
  const abort = useRef<AbortController | null>(null);
  const pending = useRef<Promise<void> | null>(null); // the reply being generated
  const nextId = useRef(0);
  const list = useRef<FlatList<Message>>(null);

  const generate = useCallback(async (text: string) => {
    const replyId = nextId.current + 1;
    nextId.current += 2;
    setBusy(true);
    setMessages((ms) => [...ms, { id: replyId - 1, role: 'user', text }, { id: replyId, role: 'assistant', text: '' }]);
    const update = (patch: Partial<Message>) =>
      setMessages((ms) => ms.map((m) => (m.id === replyId ? { ...m, ...patch } : m)));
    const controller = new AbortController();
    abort.current = controller;
    try {
      const reply = await session.send(text, {
        signal: controller.signal,
        onToken: (_id, textSoFar) => update({ text: textSoFar }),
      });
      update({ text: reply.text, stats: statsLine(reply, session, engine) });
      setStatus(`KV ${session.kvUsed()}/${session.capacity} · ${engine.plan.summary}${recallLine(engine)}`);
    } catch (err) {
      update({ role: 'error', text: errorText(err) });
    } finally {
      abort.current = null;
      setBusy(false);
    }
  }, [engine, session]);

  const send = () => {
    const text = input.trim();
    if (!text || busy) return;
    setInput('');
    pending.current = generate(text);
  };

  const newChat = () => {
    session.reset();
    setMessages([]);
    setStatus(`new chat · KV ${session.kvUsed()}/${session.capacity} · ${engine.plan.summary}${recallLine(engine)}`);
  };

  const forget = async () => { // nothing written before drafts any more; the store's file is emptied too
    try {
      await engine.forget();
      setStatus(`forgotten · ${engine.plan.summary}${recallLine(engine)}`);
    } catch (err) {
      setStatus(errorText(err));
    }
  };

  const close = async () => {
    abort.current?.abort(); // the engine stops between steps; close it only after that
    await pending.current;
    props.onClose();
  };

  return (
    <KeyboardAvoidingView style={styles.fill} behavior={Platform.OS === 'ios' ? 'padding' : undefined}>
      <View style={styles.row}>
        <Text style={[styles.title, styles.fill]} numberOfLines={1}>{artifact.name}</Text>
        <Button label="New chat" onPress={newChat} disabled={busy} />
        {engine.recall !== null && <Button label="Forget" onPress={() => void forget()} disabled={busy} />}
        <Button label="Close" onPress={() => void close()} />
      </View>
      <Text style={styles.muted}>{status}</Text>
      <Text style={styles.muted} numberOfLines={1}>{props.lastLog}</Text>
      <FlatList
        ref={list}
        style={styles.fill}
        data={messages}
        keyExtractor={(m) => String(m.id)}
        onContentSizeChange={() => list.current?.scrollToEnd({ animated: false })}
        renderItem={({ item }) => (
          <View style={[styles.bubble, item.role === 'user' ? styles.user : item.role === 'error' ? styles.errorBubble : styles.assistant]}>
            <Text style={styles.bubbleText}>{item.text || (busy ? '…' : '')}</Text>
            {item.stats !== undefined && <Text style={styles.stats}>{item.stats}</Text>}
          </View>
        )}
      />
      <View style={styles.row}>
        <TextInput
          style={[styles.input, styles.fill]}
          value={input}
          onChangeText={setInput}
          placeholder="Message"
          multiline
          editable={!busy}
        />
        {busy
          ? <Button label="Stop" danger onPress={() => abort.current?.abort()} />
          : <Button label="Send" onPress={send} disabled={!input.trim()} />}
      </View>
    </KeyboardAvoidingView>
  );
}

export default function App() {
  const [loaded, setLoaded] = useState<Loaded | null>(null);
  const [opening, setOpening] = useState(false);
  const [log, setLog] = useState<string[]>([]); // the engine's log lines: the load's, then later ones
  const [error, setError] = useState<string | null>(null);

  const open = useCallback(async (artifact: ArtifactEntry, mode: Mode, choice: FormatChoice, remember: boolean, decoding: Decoding) => {
    const format = resolveFormat(choice, artifact);
    const started = Date.now();
    // the engine keeps this for later lines too (auto mode measures its verify latency at the first reply)
    const write = (line: string) =>
      setLog((lines) => [...lines.slice(-50), `${((Date.now() - started) / 1000).toFixed(1)} s  ${line}`]);
    setError(null);
    setLog([]);
    setOpening(true);
    write(`opening ${artifact.name} (${format} graphs, mode ${mode}, ${decoding}${remember ? ', recall on' : ''}) ...`);
    try {
      const engine = await openEngine({
        // onnxruntime-react-native implements onnxruntime-common's API, the one copy in this app (tsconfig.json paths)
        ort,
        source: new DeviceSource(artifact.path),
        mode,
        sampling: decoding === 'greedy' ? { temperature: 0 } : undefined, // else the manifest's settings
        modelFormat: format,
        recall: remember ? { file: new RecallFileOnPhone(artifact.name), digest } : undefined,
        // no `grammar`: structured output (JSON replies) needs xgrammar's WebAssembly build, and Hermes has no
        // WebAssembly; the engine answers a constrained request with a one-line error saying so
        log: write,
      });
      write('ready');
      setLoaded({ artifact, engine, format, session: new ChatSession(engine) });
    } catch (err) {
      setError(errorText(err));
    } finally {
      setOpening(false);
    }
  }, []);

  const close = useCallback(() => {
    const engine = loaded?.engine;
    setLoaded(null);
    engine?.close().catch((err: unknown) => setError(errorText(err)));
  }, [loaded]);

  return (
    <SafeAreaProvider>
      <StatusBar barStyle="dark-content" />
      <SafeAreaView style={styles.screen}>
        {error !== null && <Text style={styles.error} onPress={() => setError(null)}>{error}</Text>}
        {opening ? (
          <View style={styles.fill}>
            <ActivityIndicator size="large" />
            {log.map((line, i) => <Text key={i} style={styles.muted}>{line}</Text>)}
          </View>
        ) : loaded !== null ? (
          <Chat loaded={loaded} lastLog={log[log.length - 1] ?? ''} onClose={close} />
        ) : (
          <Picker onOpen={(artifact, mode, format, remember, decoding) => void open(artifact, mode, format, remember, decoding)} />
        )}
      </SafeAreaView>
    </SafeAreaProvider>
  );
}

const styles = StyleSheet.create({
  screen: { flex: 1, backgroundColor: '#fafafa', padding: 12 },
  fill: { flex: 1 },
  row: { flexDirection: 'row', alignItems: 'center', gap: 6, marginVertical: 4 },
  title: { fontSize: 20, fontWeight: '600', color: '#111' },
  label: { width: 56, color: '#444' },
  muted: { fontSize: 12, color: '#666', marginVertical: 2 },
  hint: { marginTop: 16, color: '#333', lineHeight: 20 },
  error: { color: '#b00020', marginVertical: 6 },
  chip: { borderWidth: 1, borderColor: '#999', borderRadius: 14, paddingHorizontal: 10, paddingVertical: 4 },
  chipActive: { backgroundColor: '#1f5fbf', borderColor: '#1f5fbf' },
  chipText: { color: '#333' },
  chipTextActive: { color: '#fff' },
  button: { backgroundColor: '#1f5fbf', borderRadius: 6, paddingHorizontal: 14, paddingVertical: 10 },
  buttonDanger: { backgroundColor: '#b00020' },
  buttonDisabled: { opacity: 0.4 },
  buttonText: { color: '#fff', fontWeight: '600' },
  artifact: { padding: 12, marginVertical: 4, borderRadius: 8, backgroundColor: '#fff', borderWidth: 1, borderColor: '#ddd' },
  artifactName: { fontSize: 16, color: '#111' },
  bubble: { borderRadius: 10, padding: 10, marginVertical: 4, maxWidth: '92%' },
  user: { alignSelf: 'flex-end', backgroundColor: '#dce8fb' },
  assistant: { alignSelf: 'flex-start', backgroundColor: '#fff', borderWidth: 1, borderColor: '#ddd' },
  errorBubble: { alignSelf: 'flex-start', backgroundColor: '#fde7ea' },
  bubbleText: { fontSize: 15, color: '#111' },
  stats: { fontSize: 11, color: '#666', marginTop: 6 },
  input: { borderWidth: 1, borderColor: '#bbb', borderRadius: 6, paddingHorizontal: 10, maxHeight: 120, backgroundColor: '#fff' },
});
