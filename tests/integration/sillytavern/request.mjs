// SillyTavern's text-completion request bodies, built by its own code: the
// getTextGenGenerationData() (and createTextGenGenerationData()) of the `sillytavern` npm
// package's public/scripts/textgen-settings.js, run in node (stub-hooks.mjs stubs the
// page around it). Works with 1.19.0 (what the tests use) and 1.12.6.
//
//   node request.mjs PACKAGE_DIR < cases.json > bodies.json
//
// Each case: {type, preset, n, maxTokens, stop, prompt, serverUrl, model}. Its settings are
// what the program holds after starting on its default settings and picking the preset:
// - textgen-settings.js' in-code defaults, then default/content/settings.json's
//   textgenerationwebui_settings through loadTextGenSettings() (as at startup);
// - the preset (default/content/presets/textgen/NAME.json, or none: the default settings
//   themselves) as selectPreset() applies it: each of setting_names the preset has, through
//   loadTextGenSettings() again (its setSettingByName fills the sampler lists);
// - the API type as the #textgen_type change handler sets it: for vLLM, Aphrodite and
//   InfermaticAI a Top K of 0 becomes -1 (their "off");
// - "Multiple swipes per generation" (`n`), the server URL and, for vLLM and Aphrodite,
//   the model picked from the server's list (and for Tabby and llama.cpp, since 1.19).
// Prints the bodies, and src/constants.js' key lists the ST server filters bodies with.
import { readFileSync } from 'node:fs';
import { register } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const pkg = process.argv[2];
// SillyTavern logs as it goes: to stderr, so that stdout holds only the answer.
for (const level of ['log', 'debug', 'info', 'warn']) console[level] = console.error;
const textgen = join(pkg, 'public/scripts/textgen-settings.js');
register('./stub-hooks.mjs', import.meta.url, {
    data: { real: [textgen, join(pkg, 'public/scripts/utils.js')] },
});

// What the stubbed page modules give: a value for the few the builder reads, and for
// everything else an object that accepts any use (jQuery calls, DOM lookups) and does nothing.
function inert() {
    const target = function () {};
    return new Proxy(target, {
        get: (_, key) => {
            if (key === Symbol.toPrimitive) return () => '';
            if (key === 'then') return undefined; // not a promise
            return inert();
        },
        apply: () => inert(),
        construct: () => inert(),
    });
}
const page = {
    power_user: { request_token_probabilities: false },
    max_context: 8192,
    main_api: 'textgenerationwebui',
    substituteParams: (text) => text,
    getStoppingStrings: () => globalThis.__stStop,
    getTextTokens: () => [],
    t: (strings, ...values) => String.raw({ raw: strings }, ...values),
    BIAS_CACHE: new Map(),
};
globalThis.__stStub = (name) => (name in page ? page[name] : inert());
// The DOM the module reads as it loads: the dynamic-temperature block's API types.
const index = readFileSync(join(pkg, 'public/index.html'), 'utf8');
const dynatempTypes = index.match(/data-tg-type="([^"]*)"[^>]*id="dynatemp_block_ooba"/)?.[1];
globalThis.document = new Proxy({}, {
    get: (_, key) => key === 'getElementById'
        ? (id) => (id === 'dynatemp_block_ooba' ? { dataset: { tgType: dynatempTypes } } : inert())
        : inert(),
});
globalThis.localStorage = { getItem: () => null, setItem: () => {} };
globalThis.$ = globalThis.jQuery = inert();
globalThis.toastr = inert();

const st = await import(pathToFileURL(textgen));
const imported = await import(pathToFileURL(join(pkg, 'src/constants.js')));
const constants = imported.VLLM_KEYS ? imported : imported.default; // 1.12's is CommonJS
const defaults = JSON.parse(readFileSync(join(pkg, 'default/content/settings.json'), 'utf8'));
const pristine = structuredClone(st.textgenerationwebui_settings);

async function settingsFor(testCase) {
    const settings = st.textgenerationwebui_settings;
    for (const key of Object.keys(settings)) delete settings[key];
    Object.assign(settings, structuredClone(pristine));
    const empty = { textgenerationwebui_presets: [], textgenerationwebui_preset_names: [] };
    await st.loadTextGenSettings(empty, structuredClone(defaults));
    if (testCase.preset) {
        const picked = {};
        for (const name of st.setting_names) {
            const value = testCase.preset[name];
            if (value !== undefined && value !== null) picked[name] = structuredClone(value);
        }
        await st.loadTextGenSettings(empty, { textgenerationwebui_settings: picked });
    }
    settings.type = testCase.type;
    if (['vllm', 'aphrodite', 'infermaticai'].includes(testCase.type) && settings.top_k === 0) {
        settings.top_k = -1;
    }
    settings.n = testCase.n;
    settings.server_urls = { [testCase.type]: testCase.serverUrl };
    // the model picked from the server's list (1.19's Tabby and llama.cpp types have a
    // picker too, textgen-models.js: the first listed until one is chosen)
    settings.vllm_model = settings.aphrodite_model = testCase.model;
    settings.tabby_model = settings.llamacpp_model = testCase.model;
    return settings;
}

const cases = JSON.parse(readFileSync(0, 'utf8'));
const bodies = [];
for (const testCase of cases) {
    await settingsFor(testCase);
    globalThis.__stStop = testCase.stop;
    // A normal generation (not impersonate, continue or quiet: multi-swipe applies). Since
    // 1.13 it hands the settings to createTextGenGenerationData; 1.12 reads them itself.
    const body = await st.getTextGenGenerationData(
        testCase.prompt, testCase.maxTokens, false, false, null, 'normal',
    );
    bodies.push(JSON.parse(JSON.stringify(body)));
}
process.stdout.write(JSON.stringify({
    bodies,
    VLLM_KEYS: constants.VLLM_KEYS,
    OPENAI_KEYS: constants.OPENAI_KEYS,
}));
