// Preloaded (NODE_OPTIONS=--require) into Node peers the tests start with
// PORT=0: they bind a port of their own choosing, and this says which one on
// stderr, so that parallel tests never race for a port picked beforehand.
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  this.once("listening", () => {
    const address = this.address();
    if (address && typeof address === "object") {
      console.error(`node peer listening on http://127.0.0.1:${address.port}/`);
    }
  });
  return listen.apply(this, args);
};
