// Module hooks for request.mjs: SillyTavern's request builder (public/scripts/
// textgen-settings.js) and its helpers (utils.js) load as they ship; every other module
// they import (the page: script.js, jQuery, the DOM) is replaced by a stub whose named
// exports come from globalThis.__stStub, so the builder runs in node unchanged.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

let real = new Set();

export async function initialize(data) {
    real = new Set(data.real);
}

// The names `parentURL` imports from `specifier` (import { a, b as c } / import d / * as e).
function importedNames(parentURL, specifier) {
    const source = readFileSync(fileURLToPath(parentURL), 'utf8');
    const names = new Set();
    const quoted = specifier.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const pattern = new RegExp(`import\\s+([^;]*?)\\s+from\\s+['"]${quoted}['"]`, 'g');
    for (const match of source.matchAll(pattern)) {
        const clause = match[1];
        const braces = clause.match(/\{([^}]*)\}/);
        if (braces) {
            for (const part of braces[1].split(',')) {
                const name = part.trim().split(/\s+as\s+/)[0].trim();
                if (name) names.add(name);
            }
        }
        if (/^[A-Za-z_$][\w$]*/.test(clause.replace(/\{[^}]*\}/, '').trim())) names.add('default');
    }
    return [...names];
}

export async function resolve(specifier, context, nextResolve) {
    const resolved = await nextResolve(specifier, context);
    const isStubbed = resolved.url.startsWith('file:') && resolved.url.includes('/public/')
        && !real.has(fileURLToPath(resolved.url));
    if (!isStubbed) return resolved;
    const names = importedNames(context.parentURL, specifier);
    const url = `stub:${encodeURIComponent(resolved.url)}?names=${encodeURIComponent(names.join(','))}`;
    return { url, shortCircuit: true };
}

export async function load(url, context, nextLoad) {
    // The page's scripts are ES modules whatever package.json says (1.12's says nothing).
    if (url.startsWith('file:') && real.has(fileURLToPath(url))) {
        return nextLoad(url, { ...context, format: 'module' });
    }
    if (!url.startsWith('stub:')) return nextLoad(url, context);
    const names = decodeURIComponent(url.split('?names=')[1] ?? '').split(',').filter(Boolean);
    const lines = names.map((name) => name === 'default'
        ? 'export default globalThis.__stStub("default");'
        : `export const ${name} = globalThis.__stStub(${JSON.stringify(name)});`);
    return { format: 'module', source: lines.join('\n'), shortCircuit: true };
}
