/**
 * Kubernetes resource quantities (`"2Gi"`, `"500m"`, `"1e3"`, `128974848`).
 *
 * @module
 */

import type { Quantity } from "./types.ts";

/** Thrown when a string is not a Kubernetes quantity. */
export class QuantityParseError extends Error {
  /** The text that failed to parse. */
  readonly input: string;
  /** Creates the error for `input`. */
  constructor(input: string, options?: ErrorOptions) {
    super(`Cannot parse quantity "${input}": expected a number with an optional suffix`, options);
    this.name = "QuantityParseError";
    this.input = input;
  }
}

const BINARY_SUFFIXES: Record<string, number> = {
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};

const DECIMAL_SUFFIXES: Record<string, number> = {
  n: 1e-9,
  u: 1e-6,
  m: 1e-3,
  "": 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
};

const QUANTITY_RE =
  /^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$/;

/**
 * The value of a quantity as a number, e.g. `"1Gi"` -> 1073741824, `"500m"` -> 0.5.
 * Throws {@linkcode QuantityParseError} on malformed input.
 */
export function parseQuantity(quantity: Quantity): number {
  if (typeof quantity === "number") {
    if (!Number.isFinite(quantity)) throw new QuantityParseError(String(quantity));
    return quantity;
  }
  const match = QUANTITY_RE.exec(quantity.trim());
  if (!match) throw new QuantityParseError(quantity);
  const [, digits, exponent, suffix] = match;
  const base = Number(digits);
  if (exponent !== undefined) return base * 10 ** Number(exponent.slice(1));
  const factor = BINARY_SUFFIXES[suffix ?? ""] ?? DECIMAL_SUFFIXES[suffix ?? ""];
  return base * factor;
}

/**
 * The value of a quantity rounded up to a whole number, as Kubernetes' `Value()` does:
 * `"1.5"` -> 2, `"2Gi"` -> 2147483648.
 */
export function quantityToInteger(quantity: Quantity): number {
  return Math.ceil(parseQuantity(quantity));
}
