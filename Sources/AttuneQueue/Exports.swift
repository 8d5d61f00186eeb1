// The codecs are a module of their own (no rabbitmq-c: the fuzzer links them alone); whoever imports the
// queue gets them too.
@_exported import AttuneCodecs
