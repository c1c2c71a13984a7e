#!/usr/bin/env node
/**
 * specmemo-node: the TypeScript engine from a terminal, on onnxruntime-node. Mirrors
 * `specmemo generate` / `specmemo chat` so the two runtimes can be compared id for id.
 */

import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

import * as ort from 'onnxruntime-node';

import { parseRoute } from './backend';
import { ChatSession } from './chat';
import { ConstraintSpec } from './constraint';
import { openEngine } from './engine';
import { ModelFormat } from './manifest';
import { FolderSource, RecallFileOnDisk, loadXGrammar } from './node';
import { DEFAULTS, SamplingRequest } from './sampling';
import { SHARED } from './shared';

const UNITS: Record<string, number> = { '': 1, b: 1, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, kb: 1e3, mb: 1e6, gb: 1e9 };

/** '8MiB' → 8388608; a one-line error naming the form otherwise. */
function parseSize(text: string): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const unit = match ? UNITS[match[2].toLowerCase()] : undefined;
  if (!match || unit === undefined) throw new Error(`--recall-budget ${JSON.stringify(text)}: give a size such as 8MiB, 512KiB or a number of bytes`);
  return Math.floor(Number(match[1]) * unit);
}

const HELP = `usage: specmemo-node <generate|chat> --artifact DIR [options]

  generate   one reply to --prompt, through the model's chat template (like \`specmemo generate\`)
  chat       a multi-turn conversation: each --message is a user turn, replies reuse the KV cache
             (like \`specmemo chat\`); with --json, one JSON line per turn

options:
  --artifact DIR        the exported artifact folder (manifest.json, decoder.onnx, ...)
  --prompt TEXT         the user message (generate)
  --message TEXT        a user turn (chat; repeat for several turns)
  --system TEXT         optional system message
  --max-new-tokens N    default ${SHARED.max_new_tokens.generate} (generate), ${SHARED.max_new_tokens.chat} (chat)
  --mode M              how each step drafts: auto (default) | tree | plain (no drafting); greedy: plain
                        with argmax decoding (--mode plain --temperature 0). Tree and auto only change how
                        many tokens a step verifies: the tokens are the sampling's, the same in every mode
  --drafter D           medusa, feature, lookup, recall, or several joined by '+', e.g. feature+lookup
                        (default: the manifest's)
  --capacity C          KV positions to allocate (default: the manifest's plan, else its max)
  --threads N           ONNX Runtime intra-op threads (default ${SHARED.threads})
  --model-format F      onnx (default) or ort (the .ort graphs of an \`export --mobile\` artifact)
  --route RxM           rows every call runs, at least R and a multiple of M (default: the manifest's);
                        give the one \`specmemo plan\` probed on this machine so greedy and speculative
                        steps compute every token alike here
  --recall FILE         draft from what was written before (earlier turns and runs), kept in FILE: every
                        turn joins it; the same file \`specmemo chat --recall\` keeps (docs/recall.md)
  --recall-budget SIZE  the store's memory, e.g. 8MiB (default), 512KiB or bytes
  --forget              empty the --recall store before starting
  --recall-add FILE     add a text file to the store first (a project's source); repeat for several
  --json-schema FILE    the reply is compact JSON valid against this JSON schema (generate; as
                        \`specmemo generate --json-schema\`: xgrammar here, llguidance in Python)
  --json-object         the reply is a JSON object (generate)
  --choice TEXT         the reply is one of these strings (generate; repeat it)
  --ignore-eos          keep generating past end-of-turn (for measurements)

sampling (as \`specmemo generate\`: what is not given comes from the artifact's manifest, its model's
generation config, else ${describedDefaults()}; the same seed gives the Python runtime's tokens):
  --temperature T       0: greedy (argmax); > 0: sample
  --top-p P             keep the most likely tokens up to this mass (1: off)
  --top-k K             keep this many most likely tokens (0: off)
  --repetition-penalty R  > 1 discourages tokens already in the conversation (1: off)
  --seed N              the draws' seed (default 0)
  --acceptance A        exact (default: a draft is kept where it is plain sampling's draw) or typical
  --json                print JSON: text, token_ids, stats (as \`specmemo generate --json\`)
  -h, --help            this text`;

function describedDefaults(): string {
  const d = DEFAULTS;
  return `temperature ${d.temperature}, top-p ${d.top_p}, top-k ${d.top_k}, repetition penalty ${d.repetition_penalty}`;
}

/** --temperature … --acceptance as the engine's sampling request; a flag beside temperature 0 is refused (Python's
 * check_sampling_flags). */
function samplingFlags(values: Record<string, unknown>): SamplingRequest {
  const number = (flag: string, integer = false): number | undefined => {
    const text = values[flag] as string | undefined;
    if (text === undefined) return undefined;
    const value = Number(text);
    if (text.trim() === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new Error(`--${flag} ${JSON.stringify(text)}: give ${integer ? 'an integer' : 'a number'}`);
    }
    return value;
  };
  const request: SamplingRequest = {
    temperature: number('temperature'), topP: number('top-p'), topK: number('top-k', true),
    repetitionPenalty: number('repetition-penalty'), seed: number('seed', true) ?? 0,
  };
  const acceptance = values.acceptance as string | undefined;
  if (acceptance !== undefined) {
    if (acceptance !== 'exact' && acceptance !== 'typical') throw new Error(`--acceptance ${JSON.stringify(acceptance)}: use exact or typical`);
    request.acceptance = acceptance;
  }
  const given = ['top-p', 'top-k', 'repetition-penalty'].filter((flag) => values[flag] !== undefined).map((flag) => `--${flag}`);
  if (request.temperature !== undefined && request.temperature <= 0 && given.length) {
    throw new Error(`${given.join(', ')} needs sampling: give --temperature > 0 (temperature 0 is exact greedy)`);
  }
  return request;
}

async function main(): Promise<number> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      artifact: { type: 'string' }, prompt: { type: 'string' }, message: { type: 'string', multiple: true },
      system: { type: 'string' }, 'max-new-tokens': { type: 'string' }, mode: { type: 'string', default: 'auto' },
      drafter: { type: 'string' }, capacity: { type: 'string' }, threads: { type: 'string', default: String(SHARED.threads) },
      'model-format': { type: 'string', default: 'onnx' }, route: { type: 'string' }, 'ignore-eos': { type: 'boolean', default: false },
      recall: { type: 'string' }, 'recall-budget': { type: 'string' }, forget: { type: 'boolean', default: false },
      'recall-add': { type: 'string', multiple: true }, 'json-schema': { type: 'string' },
      'json-object': { type: 'boolean', default: false }, choice: { type: 'string', multiple: true },
      json: { type: 'boolean', default: false }, help: { type: 'boolean', short: 'h', default: false },
      temperature: { type: 'string' }, 'top-p': { type: 'string' }, 'top-k': { type: 'string' },
      'repetition-penalty': { type: 'string' }, seed: { type: 'string' }, acceptance: { type: 'string' },
    },
  });
  const command = positionals[0];
  if (values.help || !command) {
    console.log(HELP);
    return values.help ? 0 : 2;
  }
  if (!['generate', 'chat'].includes(command)) throw new Error(`unknown command ${JSON.stringify(command)}: use generate or chat (see --help)`);
  if (!values.artifact) throw new Error('--artifact is required: the folder `specmemo export` wrote');
  const maxNewTokens = Number(values['max-new-tokens'] ?? SHARED.max_new_tokens[command === 'chat' ? 'chat' : 'generate']);
  const adds = values['recall-add'] ?? [];
  if ((values['recall-budget'] !== undefined || values.forget || adds.length) && values.recall === undefined) {
    throw new Error('--recall-budget, --forget and --recall-add act on a recall store: give --recall FILE');
  }
  const recall = values.recall === undefined ? undefined
    : { file: new RecallFileOnDisk(values.recall), budget: values['recall-budget'] === undefined ? undefined : parseSize(values['recall-budget']) };
  const constraints = [values['json-schema'] !== undefined, values['json-object'], (values.choice ?? []).length > 0];
  if (constraints.filter(Boolean).length > 1) throw new Error('give one of --json-schema, --json-object and --choice');
  const constraint: ConstraintSpec | undefined = values['json-schema'] !== undefined
    ? { kind: 'json_schema', schema: await readFile(values['json-schema'], 'utf-8').catch((err: NodeJS.ErrnoException) => {
      throw new Error(`--json-schema ${values['json-schema']}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`);
    }) }
    : values['json-object'] ? { kind: 'json_object' } : values.choice?.length ? { kind: 'choice', choices: values.choice } : undefined;
  const sampling = samplingFlags(values);
  const source = new FolderSource(values.artifact);
  const engine = await openEngine({
    ort, source, mode: values.mode, drafter: values.drafter, threads: Number(values.threads),
    route: values.route === undefined ? undefined : parseRoute(values.route),
    capacity: values.capacity === undefined ? undefined : Number(values.capacity),
    modelFormat: values['model-format'] as ModelFormat, log: (line) => process.stderr.write(`${line}\n`), recall,
    grammar: constraint === undefined ? undefined : loadXGrammar(), sampling,
  });
  try {
    if (values.forget) await engine.forget();
    for (const file of adds) process.stderr.write(`recall: ${file} added (${await engine.remember(await readFile(file, 'utf-8'))} tokens)\n`);
    if (command === 'generate') {
      if (values.prompt === undefined) throw new Error('--prompt is required for generate');
      const messages = [...(values.system ? [{ role: 'system' as const, content: values.system }] : []),
        { role: 'user' as const, content: values.prompt }];
      const ids = engine.tokenizer.encodeChat(messages);
      const result = await engine.generate(ids, {
        maxNewTokens, ignoreEos: values['ignore-eos'], constraint,
        onToken: values.json ? undefined : (id) => process.stdout.write(engine.tokenizer.decode([id])),
      });
      const text = engine.tokenizer.decode(result.tokenIds.filter((t) => !engine.tokenizer.eosTokenIds.has(t)));
      if (values.json) console.log(JSON.stringify({ text, token_ids: result.tokenIds, prompt_ids: ids, plan: engine.plan, stats: result.stats }));
      else process.stdout.write('\n');
    } else {
      const chat = new ChatSession(engine, { system: values.system, maxNewTokens });
      for (const message of values.message ?? []) {
        const reply = await chat.send(message);
        if (values.json) console.log(JSON.stringify({ text: reply.text, token_ids: reply.tokenIds, reused: reply.reused, prefilled: reply.prefilled, stats: reply.stats }));
        else console.log(`> ${message}\n${reply.text}\n[${reply.stats.decodeTokensPerS.toFixed(1)} tok/s, ${reply.stats.meanAccepted.toFixed(2)} accepted/step, reused ${reply.reused}]`);
      }
    }
  } finally {
    await engine.close();
    source.close();
  }
  return 0;
}

main().then((code) => { process.exitCode = code; }, (err: Error) => {
  process.stderr.write(`error: ${err.message.split('\n')[0]}\n`);
  process.exitCode = 1;
});
