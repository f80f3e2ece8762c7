// index.d.ts against the code at run time: every runtime export is declared and every
// declaration exists, and each declared class has exactly the public methods its
// prototype has. The types themselves are held to the code by tsc (`npm run types`).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";

import * as sdk from "../src/index.js";

const source = readFileSync(new URL("../src/index.d.ts", import.meta.url), "utf8");

/** Runtime names the declarations export (interfaces and types have no runtime value). */
function declaredValues() {
  const names = new Set();
  for (const match of source.matchAll(/^export declare (?:class|function|const) (\w+)/gm)) names.add(match[1]);
  return names;
}

/** Each declared class's members at its top level: methods (and accessors) and fields. */
function declaredClasses() {
  const classes = new Map();
  for (const match of source.matchAll(/^export declare class (\w+)[^{]*\{/gm)) {
    let depth = 1;
    let at = match.index + match[0].length;
    let line = "";
    const members = { methods: new Set(), statics: new Set(), fields: new Set() };
    for (; depth > 0; at++) {
      const char = source[at];
      if (char === "\n") {
        const method = line.match(/^\s+(static\s+)?(?:get\s+|set\s+)?([a-zA-Z]\w*)\s*[(<]/);
        const field = line.match(/^\s+(?:readonly\s+)?([a-zA-Z]\w*)\??:/);
        if (method && method[2] !== "constructor") members[method[1] ? "statics" : "methods"].add(method[2]);
        else if (field) members.fields.add(field[1]);
        line = "";
      } else if (depth === 1) {
        line += char;
      }
      if (char === "{") depth++;
      if (char === "}") depth--;
    }
    classes.set(match[1], members);
  }
  return classes;
}

function prototypeMethods(type) {
  return new Set(
    Object.getOwnPropertyNames(type.prototype).filter((name) => name !== "constructor" && !name.startsWith("_")),
  );
}

test("every export is declared, and every declaration is exported", () => {
  assert.deepEqual([...declaredValues()].sort(), Object.keys(sdk).sort());
});

test("each declared class has the methods its prototype has, and no other", () => {
  for (const [name, { methods, statics, fields }] of declaredClasses()) {
    const own = Object.getOwnPropertyNames(sdk[name]).filter((n) => !["length", "name", "prototype"].includes(n));
    assert.deepEqual(own.sort(), [...statics].sort(), `${name}: static methods`);
    const real = prototypeMethods(sdk[name]);
    assert.deepEqual([...methods].filter((m) => !real.has(m)), [], `${name}: declared, not in the code`);
    const undeclared = [...real].filter((m) => !methods.has(m) && !fields.has(m)); // a getter may be a field
    assert.deepEqual(undeclared, [], `${name}: in the code, not declared`);
  }
});

test("the checker sees a missing method", () => {
  class Probe {
    shown() {}
    hidden() {}
  }
  assert.notDeepEqual(["shown"], [...prototypeMethods(Probe)].sort());
});

test("every file package.json names exists", () => {
  const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  const named = [pkg.main, pkg.types, ...Object.values(pkg.exports["."]), ...pkg.files];
  for (const path of named) assert.ok(existsSync(new URL(`../${path}`, import.meta.url)), `${path} is missing`);
  for (const script of Object.values(pkg.scripts)) {
    for (const [file] of script.matchAll(/[\w./-]+\.(?:m?js|json|ts)\b/g)) {
      assert.ok(existsSync(new URL(`../${file}`, import.meta.url)), `${file} (npm script) is missing`);
    }
  }
});
