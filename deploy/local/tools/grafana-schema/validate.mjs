// Validates a GrafanaDashboard (JSON on stdin) against grafana-operator's CRD schema for
// grafana.integreatly.org/v1beta1, as compiled by @kubernetes-models/grafana-operator.
// Prints "valid", or "invalid: <what>" and exits 1.
import fs from "node:fs";
import { GrafanaDashboard } from "@kubernetes-models/grafana-operator/grafana.integreatly.org/v1beta1/GrafanaDashboard";

const doc = JSON.parse(fs.readFileSync(0, "utf8"));
try {
  new GrafanaDashboard(doc).validate();
  console.log("valid");
} catch (e) {
  console.log(`invalid: ${e.message}`);
  process.exit(1);
}
