import assert from "node:assert/strict";
import { parseQuantity, QuantityParseError, quantityToInteger } from "../../mod/api/mod.ts";

Deno.test("parseQuantity() reads binary, decimal, milli and exponent forms", () => {
  assert.equal(parseQuantity("1Gi"), 1073741824);
  assert.equal(parseQuantity("64Mi"), 67108864);
  assert.equal(parseQuantity("1.5Ki"), 1536);
  assert.equal(parseQuantity("2G"), 2e9);
  assert.equal(parseQuantity("1k"), 1000);
  assert.equal(parseQuantity("500m"), 0.5);
  assert.equal(parseQuantity("1e3"), 1000);
  assert.equal(parseQuantity("42"), 42);
  assert.equal(parseQuantity(7), 7);
});

Deno.test("quantityToInteger() rounds up as Kubernetes does", () => {
  assert.equal(quantityToInteger("1500m"), 2);
  assert.equal(quantityToInteger("2"), 2);
});

Deno.test("parseQuantity() rejects malformed quantities", () => {
  for (const bad of ["", "Gi", "1GB", "1 Gi", "abc", "--1"]) {
    assert.throws(() => parseQuantity(bad), QuantityParseError, bad);
  }
  assert.throws(() => parseQuantity("1GB"), /Cannot parse quantity "1GB"/);
});
