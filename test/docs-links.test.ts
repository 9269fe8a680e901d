import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The README is the front door and the guides live in docs/ (issue 41): every guide is one link away from the README,
// and no link between them leads nowhere, neither to a file nor to a heading that a move or a rename took away.
const root = fileURLToPath(new URL('..', import.meta.url));
const guides = readdirSync(join(root, 'docs'))
  .filter((name) => name.endsWith('.md'))
  .map((name) => `docs/${name}`);
const documents = ['README.md', 'bench/results/HISTORY.md', ...guides];

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens; repeats get -1, -2, ... */
function anchors(markdown: string): Set<string> {
  const found = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    if (fenced) continue;
    const heading = /^#{1,6} (.*)$/.exec(line);
    if (heading) {
      const slug = heading[1]!
        .trim()
        .toLowerCase()
        .replace(/[^\p{L}\p{N} _-]/gu, '')
        .replace(/ /g, '-');
      const n = seen.get(slug) ?? 0;
      seen.set(slug, n + 1);
      found.add(n === 0 ? slug : `${slug}-${n}`);
    }
    for (const id of line.matchAll(/<a id="([^"]+)"><\/a>/g)) found.add(id[1]!);
  }
  return found;
}

/** Links outside code: [text](target), targets that are not URLs. */
function links(markdown: string): string[] {
  const prose = markdown.replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '');
  return [...prose.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!).filter((target) => !/^[a-z]+:/.test(target));
}

describe('README and guides', () => {
  it('links every guide in docs/ from the README', () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    const linked = new Set(links(readme).map((target) => target.split('#')[0]));
    expect(guides.length).toBeGreaterThan(0);
    expect(guides.filter((guide) => !linked.has(guide))).toEqual([]);
  });

  it('has no link to a missing file or heading', () => {
    const broken: string[] = [];
    for (const document of documents) {
      const text = readFileSync(join(root, document), 'utf8');
      for (const target of links(text)) {
        const [path, anchor] = target.split('#') as [string, string | undefined];
        const file = path === '' ? join(root, document) : join(root, dirname(document), path);
        if (!existsSync(file)) broken.push(`${document}: ${target} (no file)`);
        else if (anchor !== undefined && file.endsWith('.md') && !anchors(readFileSync(file, 'utf8')).has(anchor))
          broken.push(`${document}: ${target} (no heading ${relative(root, file)}#${anchor})`);
      }
    }
    expect(broken).toEqual([]);
  });
});
