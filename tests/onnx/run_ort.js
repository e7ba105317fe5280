// ONNX Runtime (npm's onnxruntime-node) on every NAME.onnx of a folder, against NAME.onnx.reference
// (replica::onnx::write_reference): prints one line per model with the difference
// max |ort - replica| / max(max |replica|, 1e-6) and exits 1 when any is above the tolerance.
//
//   node tests/onnx/run_ort.js FOLDER TOLERANCE     (NODE_PATH names the node_modules holding onnxruntime-node)
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

function readReference(file) {
    const b = fs.readFileSync(file);
    const magic = b.toString('latin1', 0, 8);   // RPLREF01: float inputs; RPLREF02: int32 token ids
    if (magic !== 'RPLREF01' && magic !== 'RPLREF02') throw new Error(`${file}: not a replica reference file`);
    const ids = magic === 'RPLREF02';
    const rankIn = b.readUInt32LE(8), rankOut = b.readUInt32LE(12);
    let offset = 16;
    const dims = (rank) => {
        const d = [];
        for (let i = 0; i < rank; ++i, offset += 8) d.push(Number(b.readBigUInt64LE(offset)));
        return d;
    };
    const dimsIn = dims(rankIn), dimsOut = dims(rankOut);
    const count = (d) => d.reduce((a, v) => a * v, 1);
    const floats = (n) => {
        const out = new Float32Array(n);
        for (let i = 0; i < n; ++i, offset += 4) out[i] = b.readFloatLE(offset);
        return out;
    };
    const int32s = (n) => {
        const out = new Int32Array(n);
        for (let i = 0; i < n; ++i, offset += 4) out[i] = b.readInt32LE(offset);
        return out;
    };
    const x = ids ? int32s(count(dimsIn)) : floats(count(dimsIn)), y = floats(count(dimsOut));
    if (offset !== b.length) throw new Error(`${file}: ${b.length} bytes, the header says ${offset}`);
    return {x, type: ids ? 'int32' : 'float32', dimsIn, y, dimsOut};
}

async function main() {
    const [folder, toleranceText] = process.argv.slice(2);
    const tolerance = Number(toleranceText);
    const names = fs.readdirSync(folder).filter((f) => f.endsWith('.onnx')).sort();
    if (names.length === 0) throw new Error(`no .onnx files in ${folder}`);
    let failed = 0;
    for (const name of names) {
        const file = path.join(folder, name);
        const ref = readReference(file + '.reference');
        let line, ok = false;
        try {
            const session = await ort.InferenceSession.create(file, {executionProviders: ['cpu']});
            const result = await session.run({input: new ort.Tensor(ref.type, ref.x, ref.dimsIn)});
            const got = result.output;
            if (got.dims.join('x') !== ref.dimsOut.join('x')) {
                line = `${name}: output shape ${got.dims.join('x')}, predict() gives ${ref.dimsOut.join('x')}`;
            } else {
                let diff = 0, scale = 1e-6;
                for (let i = 0; i < ref.y.length; ++i) {
                    const d = Math.abs(got.data[i] - ref.y[i]);
                    if (!(d <= diff)) diff = d;   // a NaN counts as the largest difference
                    scale = Math.max(scale, Math.abs(ref.y[i]));
                }
                const rel = diff / scale;
                ok = rel <= tolerance;
                line = `${name}: max |a - b| / max |b| = ${rel.toExponential(2)}` +
                       ` (max |b| ${scale.toPrecision(3)}, outputs ${ref.dimsOut.join('x')})`;
            }
        } catch (e) {
            line = `${name}: ONNX Runtime: ${e.message}`;
        }
        failed += !ok;
        line = (ok ? 'ok   ' : 'FAIL ') + line;
        console.log(line);
    }
    console.log(`ONNX Runtime ${require('onnxruntime-node/package.json').version}: ` +
                `${names.length - failed} of ${names.length} models within ${tolerance} of predict()`);
    process.exitCode = failed ? 1 : 0;
}

main().catch((e) => { console.error(e.message); process.exitCode = 1; });
